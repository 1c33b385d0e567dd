// Package published locates the published third-party documents tests validate against
// (SAM's schema and transform, Daytona's and E2B's API documents). They are never part of
// the repository: `make test` (scripts/test.sh) exports where the project's shared notes
// keep copies, one environment variable each. Outside CI a test without its document skips
// that check and says so; under CI=true a missing document is a failure.
package published

import (
	"errors"
	"fmt"
	"os"
)

// The environment variables naming each document (scripts/test.sh sets every one).
const (
	SAMSchema             = "SANDKEEP_SAM_SCHEMA"              // SAM's JSON schema (sam.schema.json)
	SAMTranslator         = "SANDKEEP_SAM_TRANSLATOR"          // a directory holding SAM's samtranslator/ package
	DaytonaOpenAPI        = "SANDKEEP_DAYTONA_OPENAPI"         // Daytona's main API document
	DaytonaToolboxOpenAPI = "SANDKEEP_DAYTONA_TOOLBOX_OPENAPI" // Daytona's toolbox API document
	E2BOpenAPI            = "SANDKEEP_E2B_OPENAPI"             // E2B's spec/openapi.yml
	E2BProcessProto       = "SANDKEEP_E2B_PROCESS_PROTO"       // E2B's spec/envd/process/process.proto
)

// All returns every variable above.
func All() []string {
	return []string{SAMSchema, SAMTranslator, DaytonaOpenAPI, DaytonaToolboxOpenAPI, E2BOpenAPI, E2BProcessProto}
}

// ErrMissing marks a document whose variable is unset outside CI: the caller skips the
// check it enables (and logs that it did).
var ErrMissing = errors.New("published document not available")

// Path returns the existing file or directory env names. Unset is ErrMissing, except under
// CI=true where it is an error of its own (CI validates against every document); a
// location that does not exist is always an error.
func Path(env string) (string, error) {
	p := os.Getenv(env)
	if p == "" {
		if os.Getenv("CI") == "true" {
			return "", fmt.Errorf("$%s is not set under CI=true: run the tests through `make test`, which exports it", env)
		}
		return "", fmt.Errorf("%w: $%s is not set (`make test` sets it)", ErrMissing, env)
	}
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("$%s: %w", env, err)
	}
	return p, nil
}

// Read returns the contents of the file env names and its path, with Path's rules.
func Read(env string) (data []byte, path string, err error) {
	if path, err = Path(env); err != nil {
		return nil, "", err
	}
	if data, err = os.ReadFile(path); err != nil {
		return nil, "", fmt.Errorf("$%s: %w", env, err)
	}
	if len(data) == 0 {
		return nil, "", fmt.Errorf("$%s: %s is empty", env, path)
	}
	return data, path, nil
}
