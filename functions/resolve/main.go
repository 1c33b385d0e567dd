// Command resolve is the resolve Lambda of sandkeep (a stub until the serverless issue lands).
package main

func main() {}
