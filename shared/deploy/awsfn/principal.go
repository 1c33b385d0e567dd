package awsfn

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// TrustedRoles are the IAM roles whose sessions may name the tenant in IAM mode
// (template parameter TrustedRoleArns). Any other principal that passed the API's IAM
// authorizer (an administrator, a PowerUser, an IAM user) is refused: execute-api:Invoke
// alone never lets a caller act as any tenant it likes.
type TrustedRoles struct {
	roles []roleID
}

// roleID is what identifies a role in a session ARN: partition, account and name. The
// role's path is not part of it (an assumed-role ARN omits it) and need not be: a role's
// name is unique within its account, whatever its path.
type roleID struct{ partition, account, name string }

var (
	// arn:PARTITION:iam::ACCOUNT:role/[PATH/]NAME (IAM's own character sets).
	roleARN = regexp.MustCompile(`^arn:(aws[a-z-]*):iam::([0-9]{12}):role/((?:[\x21-\x7e]+/)*)([\w+=,.@-]{1,64})$`)
	// arn:PARTITION:sts::ACCOUNT:assumed-role/NAME/SESSION: the identity API Gateway's IAM
	// authorizer reports (userArn) for a caller using a role's temporary credentials.
	sessionARN = regexp.MustCompile(`^arn:(aws[a-z-]*):sts::([0-9]{12}):assumed-role/([\w+=,.@-]{1,64})/([\w+=,.@-]{2,64})$`)
)

// errNoTrustedRoles is ParseTrustedRoles's answer to an empty list.
var errNoTrustedRoles = errors.New("names no role")

// ParseTrustedRoles parses a comma-separated list of role ARNs
// (arn:aws:iam::123456789012:role/path/name); spaces around entries are ignored. An empty
// list, "none", or anything but a role ARN (a user, a session, a wildcard) is an error.
func ParseTrustedRoles(list string) (TrustedRoles, error) {
	var t TrustedRoles
	for _, entry := range strings.Split(list, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" || strings.EqualFold(entry, "none") {
			continue
		}
		m := roleARN.FindStringSubmatch(entry)
		if m == nil || strings.Contains(m[3], "//") {
			return TrustedRoles{}, fmt.Errorf("%q is not an IAM role ARN (arn:aws:iam::ACCOUNT:role/NAME)", entry)
		}
		t.roles = append(t.roles, roleID{partition: m[1], account: m[2], name: m[4]})
	}
	if len(t.roles) == 0 {
		return TrustedRoles{}, errNoTrustedRoles
	}
	return t, nil
}

// Trusts reports whether callerARN, the userArn of API Gateway's IAM authorizer, is a
// session of one of the roles: arn:PARTITION:sts::ACCOUNT:assumed-role/NAME/SESSION with
// the role's partition, account and exact name. IAM users, the account root, federated
// users and anything malformed are never trusted.
func (t TrustedRoles) Trusts(callerARN string) bool {
	m := sessionARN.FindStringSubmatch(callerARN)
	if m == nil {
		return false
	}
	caller := roleID{partition: m[1], account: m[2], name: m[3]}
	for _, r := range t.roles {
		if r == caller {
			return true
		}
	}
	return false
}

// Len returns how many roles are trusted.
func (t TrustedRoles) Len() int { return len(t.roles) }
