// Package designdoc holds the repository's check that comments and documents cite the design
// by sections docs/design.md has, and cite no document outside the repository
// (scripts/cite-design.sh rewrites old citations; this package's test keeps them out).
package designdoc
