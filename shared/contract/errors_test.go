package contract

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestSentinelsListsEverySentinel: Sentinels is the one list of the sentinel errors, so a
// sentinel declared in this package and missing from it would be retried as an
// infrastructure failure and counted as a provider error.
func TestSentinelsListsEverySentinel(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	declared := map[string]bool{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.VAR {
				continue
			}
			for _, s := range g.Specs {
				for _, n := range s.(*ast.ValueSpec).Names {
					if strings.HasPrefix(n.Name, "Err") {
						declared[n.Name] = true
					}
				}
			}
		}
	}
	listed := Sentinels()
	if len(declared) == 0 || len(listed) != len(declared) {
		t.Fatalf("Sentinels() has %d errors, the package declares %d: %v", len(listed), len(declared), declared)
	}
	for i, s := range listed {
		if slices.Index(listed, s) != i {
			t.Fatalf("Sentinels() lists %v twice", s)
		}
		if !IsSentinel(fmt.Errorf("wrapped: %w", s)) {
			t.Fatalf("IsSentinel(wrapped %v) = false", s)
		}
	}
	for _, err := range []error{nil, errors.New("throttled"), context.Canceled, fmt.Errorf("x: %w", context.DeadlineExceeded)} {
		if IsSentinel(err) {
			t.Fatalf("IsSentinel(%v) = true", err)
		}
	}
}
