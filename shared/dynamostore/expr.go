package dynamostore

import (
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// update builds an UpdateExpression with its condition. Every attribute goes through a
// #name placeholder (several record names are DynamoDB reserved words) and every value
// through a :v placeholder; only names and values actually used are sent.
type update struct {
	names  map[string]string
	vals   map[string]types.AttributeValue
	sets   []string
	remove []string
	conds  []string
}

func newUpdate() *update {
	return &update{names: map[string]string{}, vals: map[string]types.AttributeValue{}}
}

// n returns the placeholder of attribute name.
func (u *update) n(name string) string {
	ph := "#" + name
	u.names[ph] = name
	return ph
}

// v returns a placeholder for value av.
func (u *update) v(av types.AttributeValue) string {
	ph := ":v" + strconv.Itoa(len(u.vals))
	u.vals[ph] = av
	return ph
}

// set adds `SET name = rhs`; rhs is an expression built with n and v.
func (u *update) set(name, rhs string) { u.sets = append(u.sets, u.n(name)+" = "+rhs) }

// del adds `REMOVE name`.
func (u *update) del(names ...string) {
	for _, name := range names {
		u.remove = append(u.remove, u.n(name))
	}
}

// cond adds a conjunct to the condition.
func (u *update) cond(c string) { u.conds = append(u.conds, "("+c+")") }

func (u *update) expression() *string {
	var b strings.Builder
	if len(u.sets) > 0 {
		b.WriteString("SET " + strings.Join(u.sets, ", "))
	}
	if len(u.remove) > 0 {
		if b.Len() > 0 {
			b.WriteString(" ")
		}
		b.WriteString("REMOVE " + strings.Join(u.remove, ", "))
	}
	return aws.String(b.String())
}

func (u *update) condition() *string {
	if len(u.conds) == 0 {
		return nil
	}
	return aws.String(strings.Join(u.conds, " AND "))
}

func (u *update) values() map[string]types.AttributeValue {
	if len(u.vals) == 0 {
		return nil
	}
	return u.vals
}
