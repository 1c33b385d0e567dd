package faultrun

import (
	"fmt"
	"os"
	"strings"
)

// illegal holds partition keys to dump too (set by tests before the dump runs).
var illegal []string

// DumpIllegal prints the ops of partitions porcupine found illegal (FAULTRUN_DUMP=1).
func DumpIllegal(ops []Op, keys []string) {
	illegal = keys
	dumpOps(ops, nil)
}

// dumpOps prints the recorded ops of the runs named in violations (FAULTRUN_DUMP=1).
func dumpOps(ops []Op, violations []string) {
	if os.Getenv("FAULTRUN_DUMP") == "" {
		return
	}
	keys := map[string]bool{}
	for _, v := range violations {
		for _, f := range strings.Fields(v) {
			if strings.HasPrefix(f, "fault/run-") {
				keys[strings.TrimSuffix(f, ":")] = true
			}
		}
	}
	for _, k := range illegal {
		keys[k] = true
	}
	for _, op := range ops {
		if keys[op.Key] {
			fmt.Printf("%s %s c%d [%d,%d] amb=%v %+v -> %+v\n", op.Key, op.Kind, op.Client, op.Call/1000, op.Ret/1000, op.Ambiguous, op.Input, op.Output)
		}
	}
}
