// Package faultrun holds sandkeep's fault runs (docs/design.md §10): a randomized, seeded
// workload of the operations (start, attach, append, heartbeat, detach, cancel, finish,
// reads, lock sections, reaper sweeps) driven by several replicas at once against one
// backend whose calls fail, time out or lose their responses; a recorder that keeps the
// history of every store call as the caller saw it; porcupine models of the run's fenced
// register, the event log and the lock, written from docs/design.md §2 rather than from the code;
// and the invariant checks of a finished run (one sandbox per key, no event lost,
// duplicated or reordered, epochs monotonic, no sandbox destroyed while in use).
//
// A call that failed with an infrastructure error is ambiguous: it may have applied. The
// models accept either outcome and the history gives it no return before the end, so a
// write whose response was lost is never mistaken for one that did not happen.
package faultrun
