// Package samtest holds the deployment's tests (docs/design.md §9): template.yaml against SAM JSON
// schemas and our own assertions, each function's IAM policy against the DynamoDB actions
// its handlers issue, the Makefile builds SAM runs, and every bootstrap under the AWS
// Lambda Runtime Interface Emulator. It has no code of its own.
package samtest
