package e2bfake

import (
	"errors"
	"os"

	"github.com/sandkeep/sandkeep/shared/testkit/published"
)

// LoadDocs reads the subset document at subsetPath and E2B's published OpenAPI document
// ($SANDKEEP_E2B_OPENAPI, shared/testkit/published). Without the published document the subset
// alone validates, except under CI=true, where that is an error (as is an unreadable one).
func LoadDocs(subsetPath string) (Docs, error) {
	sub, err := os.ReadFile(subsetPath)
	if err != nil {
		return Docs{}, err
	}
	d := Docs{Subset: sub}
	d.Published, d.PublishedSource, err = published.Read(published.E2BOpenAPI)
	if err != nil && !errors.Is(err, published.ErrMissing) {
		return Docs{}, err
	}
	return d, nil
}
