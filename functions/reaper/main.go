// Command reaper is the reaper Lambda of sandkeep (a stub until the serverless issue lands).
package main

func main() {}
