package contract

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
)

// KeyInput is the material of a sandbox key.
type KeyInput struct {
	ThreadID  string
	SetupID   string // the sandbox setup's id (the reference's config.id)
	Provider  string
	Workspace any // any JSON-encodable document; its top-level "secrets" member is ignored
	Tenant    string
	// RunID is set only with reuse "none", so every run gets its own sandbox.
	RunID string
}

// SandboxKey returns "sk_" + the first 32 hex digits of SHA-256 over the canonical JSON of
// {threadId, sandboxId, providerName, workspaceHash, tenant[, runId]}. It is a pure function
// of its input; golden vectors pin it, since a silent change would orphan every sandbox.
func SandboxKey(in KeyInput) (string, error) {
	wh, err := WorkspaceHash(in.Workspace)
	if err != nil {
		return "", err
	}
	m := map[string]any{
		"threadId":      in.ThreadID,
		"sandboxId":     in.SetupID,
		"providerName":  in.Provider,
		"workspaceHash": wh,
		"tenant":        in.Tenant,
	}
	if in.RunID != "" {
		m["runId"] = in.RunID
	}
	b, err := CanonicalJSON(m)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return "sk_" + hex.EncodeToString(sum[:16]), nil
}

// WorkspaceHash is the hex SHA-256 of the canonical JSON of the workspace without its
// top-level "secrets" member (rotating a secret keeps the key); no workspace hashes the
// literal "no-workspace".
func WorkspaceHash(ws any) (string, error) {
	var b []byte
	if ws == nil {
		b = []byte("no-workspace")
	} else {
		doc, err := normalize(ws)
		if err != nil {
			return "", Invalid("workspace", "%v", err)
		}
		if obj, ok := doc.(map[string]any); ok {
			delete(obj, "secrets")
		}
		if b, err = canonical(doc); err != nil {
			return "", Invalid("workspace", "%v", err)
		}
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// CanonicalJSON encodes v with object keys sorted (byte order) at every depth, no
// insignificant space, and numbers exactly as written.
func CanonicalJSON(v any) ([]byte, error) {
	doc, err := normalize(v)
	if err != nil {
		return nil, err
	}
	return canonical(doc)
}

// normalize round-trips v through JSON so every document is maps, slices, strings,
// json.Number, bools and nil.
func normalize(v any) (any, error) {
	raw, ok := v.(json.RawMessage)
	if !ok {
		var err error
		if raw, err = json.Marshal(v); err != nil {
			return nil, err
		}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, err
	}
	return doc, nil
}

func canonical(doc any) ([]byte, error) {
	var buf bytes.Buffer
	err := writeCanonical(&buf, doc)
	return buf.Bytes(), err
}

func writeCanonical(buf *bytes.Buffer, doc any) error {
	switch v := doc.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		buf.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				buf.WriteByte(',')
			}
			writeString(buf, k)
			buf.WriteByte(':')
			if err := writeCanonical(buf, v[k]); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	case []any:
		buf.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := writeCanonical(buf, e); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	case string:
		writeString(buf, v)
	case json.Number:
		buf.WriteString(v.String())
	case bool:
		fmt.Fprint(buf, v)
	case nil:
		buf.WriteString("null")
	default:
		return fmt.Errorf("canonical JSON: unexpected %T", doc)
	}
	return nil
}

func writeString(buf *bytes.Buffer, s string) {
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)           // a string always encodes
	buf.Truncate(buf.Len() - 1) // Encode appends a newline
}
