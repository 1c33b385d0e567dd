// Command detach is the detach Lambda of sandkeep (a stub until the serverless issue lands).
package main

func main() {}
