// Package syncbuf is the tests' goroutine-safe buffer: the sink of a process's output, a
// logger's lines or a metrics recorder, read while something still writes to it.
package syncbuf

import (
	"bytes"
	"strings"
	"sync"
)

// Buffer is a goroutine-safe output sink; the zero value is ready.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *Buffer) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

// String is everything written so far.
func (o *Buffer) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// Lines is every complete line written so far.
func (o *Buffer) Lines() []string {
	s := o.String()
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return strings.Split(s[:i], "\n")
	}
	return nil
}
