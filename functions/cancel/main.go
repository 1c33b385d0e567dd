// Command cancel is the cancel Lambda of sandkeep (a stub until the serverless issue lands).
package main

func main() {}
