// Package shipped holds the proof that the binaries sandkeep ships — the operator CLI
// (cmd/sandkeep) and the Lambda functions (functions/...) — link no test scaffolding: no
// package of the standard library's testing support, and none of the repository's test
// doubles and suites (keepertest, dynamotest, testkit, faultrun, e2bfake, ...); and that
// the API's packages (shared/api/wire, shared/api/apiclient) are leaves that link none of the
// operations, backends, providers or AWS code.
package shipped
