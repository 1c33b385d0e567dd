// Command log is the log Lambda of sandkeep (a stub until the serverless issue lands).
package main

func main() {}
