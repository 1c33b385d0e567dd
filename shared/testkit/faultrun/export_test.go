package faultrun

func init() { dumpHook = dumpOps }
