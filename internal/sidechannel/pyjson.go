package sidechannel

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// PyJSON encodes v exactly as Python's json.dumps(v, sort_keys=True) does
// with default separators (", " and ": ") and ensure_ascii, because
// vLLM's compatibility hash is the SHA-256 of that text. Supported: nil,
// bool, string, integers, float64, []any and map[string]any.
func PyJSON(v any) (string, error) {
	var b strings.Builder
	if err := pyjson(&b, v, pyDefault); err != nil {
		return "", err
	}
	return b.String(), nil
}

// PyJSONCompact encodes v as json.dumps(v, separators=(",", ":")) does
// (ensure_ascii on, keys of maps sorted as with sort_keys=True). The
// encoder-cache connector hashes its factors this way, unlike the KV
// connector's PyJSON form.
func PyJSONCompact(v any) (string, error) {
	var b strings.Builder
	if err := pyjson(&b, v, pyCompact); err != nil {
		return "", err
	}
	return b.String(), nil
}

// pySeps are json.dumps' item and key separators.
type pySeps struct{ item, key string }

var (
	pyDefault = pySeps{", ", ": "}
	pyCompact = pySeps{",", ":"}
)

func pyjson(b *strings.Builder, v any, sep pySeps) error {
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		if x {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case string:
		pyString(b, x)
	case int:
		b.WriteString(strconv.Itoa(x))
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case uint64:
		b.WriteString(strconv.FormatUint(x, 10))
	case float64:
		s := strconv.FormatFloat(x, 'g', -1, 64)
		if !strings.ContainsAny(s, ".eEn") {
			s += ".0" // Python's repr of a whole float
		}
		b.WriteString(s)
	case []any:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteString(sep.item)
			}
			if err := pyjson(b, e, sep); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteString(sep.item)
			}
			pyString(b, k)
			b.WriteString(sep.key)
			if err := pyjson(b, x[k], sep); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	default:
		return fmt.Errorf("pyjson: unsupported type %T", v)
	}
	return nil
}

func pyString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			switch {
			case r < 0x20 || (r >= 0x7f && r < 0x10000) || r == utf8.RuneError:
				fmt.Fprintf(b, `\u%04x`, r)
			case r >= 0x10000:
				r -= 0x10000
				fmt.Fprintf(b, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
			default:
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

// CompatHash is vLLM's NIXL compatibility hash of factors:
// sha256(json.dumps(factors, sort_keys=True)) in hex.
func CompatHash(factors map[string]any) (string, error) {
	s, err := PyJSON(factors)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:]), nil
}

// ECCompatHash is the encoder-cache connector's compatibility hash:
// sha256(json.dumps([vllm_version, model, dtype, block_size_bytes],
// separators=(",", ":"))) in hex — a JSON array, compact, so it never
// equals a KV connector hash of the same engine.
func ECCompatHash(vllmVersion, model, dtype string, blockBytes int) string {
	s, _ := PyJSONCompact([]any{vllmVersion, model, dtype, blockBytes}) // strings and an int always encode
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}
