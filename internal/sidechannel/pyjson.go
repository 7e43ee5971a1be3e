package sidechannel

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// PyJSON encodes v exactly as Python's json.dumps(v, sort_keys=True) does
// with default separators (", " and ": ") and ensure_ascii, because
// vLLM's compatibility hash is the SHA-256 of that text. Supported: nil,
// bool, string, integers, float64, []any, map[string]any (keys sorted) and
// PyDict (keys in order: json.dumps(d) without sort_keys, as SGLang's
// bootstrap server answers).
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

// PyDict is a JSON object whose keys keep their order, as a Python dict's
// keep their insertion order when json.dumps runs without sort_keys.
type PyDict []PyItem

// PyItem is one key of a PyDict.
type PyItem struct {
	Key   string
	Value any
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
	case json.Number:
		// As Python's json.loads would have read it: an int stays as
		// written, anything with a fraction or exponent is a float.
		if i, err := x.Int64(); err == nil && !strings.ContainsAny(string(x), ".eE") {
			b.WriteString(strconv.FormatInt(i, 10))
			return nil
		}
		f, err := x.Float64()
		if err != nil {
			return fmt.Errorf("pyjson: number %q: %w", x, err)
		}
		return pyjson(b, f, sep)
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
	case PyDict:
		b.WriteByte('{')
		for i, it := range x {
			if i > 0 {
				b.WriteString(sep.item)
			}
			pyString(b, it.Key)
			b.WriteString(sep.key)
			if err := pyjson(b, it.Value, sep); err != nil {
				return err
			}
		}
		b.WriteByte('}')
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

// ECCompatFactorNames are the encoder-cache connector's factors, in the
// order it hashes them: vLLM's ECCPUScheduler passes VLLM_VERSION,
// str(model_config.model), str(dtype) of the model's torch dtype (e.g.
// "torch.bfloat16") and hidden_dim*element_size to
// compute_ec_compatibility_hash (ec_connector/cpu/scheduler.py __init__
// @1730d65e).
var ECCompatFactorNames = []string{"vllm_version", "model", "dtype", "block_size_bytes"}

// ECCompatFactors are a vLLM EC connector's hash factors.
type ECCompatFactors struct {
	VLLMVersion    string `json:"vllm_version"`
	Model          string `json:"model"`
	DType          string `json:"dtype"`
	BlockSizeBytes int    `json:"block_size_bytes"`
}

// Hash is the hash a vLLM EC connector with these factors advertises.
func (f ECCompatFactors) Hash() string {
	return ECCompatHash(f.VLLMVersion, f.Model, f.DType, f.BlockSizeBytes)
}

// ParseECCompatFactors reads a JSON object of exactly the EC connector's
// four factors (a string each, block_size_bytes an integer).
func ParseECCompatFactors(b []byte) (ECCompatFactors, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil || raw == nil {
		return ECCompatFactors{}, fmt.Errorf("EC compatibility factors: want a JSON object of %s", strings.Join(ECCompatFactorNames, ", "))
	}
	for _, n := range ECCompatFactorNames {
		if _, ok := raw[n]; !ok {
			return ECCompatFactors{}, fmt.Errorf("EC compatibility factors: %q missing (vLLM's EC connector hashes %s)", n, strings.Join(ECCompatFactorNames, ", "))
		}
	}
	var f ECCompatFactors
	for k, v := range raw {
		var err error
		switch k {
		case "vllm_version":
			err = json.Unmarshal(v, &f.VLLMVersion)
		case "model":
			err = json.Unmarshal(v, &f.Model)
		case "dtype":
			err = json.Unmarshal(v, &f.DType)
		case "block_size_bytes":
			var n int64
			if err = json.Unmarshal(v, &n); err == nil && (n <= 0 || n > 1<<40) {
				err = fmt.Errorf("%d out of range", n)
			}
			f.BlockSizeBytes = int(n)
		default:
			return ECCompatFactors{}, fmt.Errorf("EC compatibility factors: %q is not one of vLLM's (%s)", k, strings.Join(ECCompatFactorNames, ", "))
		}
		if err != nil || bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
			return ECCompatFactors{}, fmt.Errorf("EC compatibility factors: %s: want a string (block_size_bytes: a positive integer), got %s", k, v)
		}
	}
	return f, nil
}

// CompatFactorNames are the factors vLLM's NixlConnector hashes into its
// compatibility hash (compute_nixl_compatibility_hash, connector version
// 12, metadata.py @02cfb534; some versions end with cross_layers_blocks
// instead of transfer_mode).
var CompatFactorNames = []string{"vllm_version", "nixl_connector_version", "model", "dtype", "num_kv_heads", "head_size",
	"num_hidden_layers", "attn_backend_name", "cache_dtype", "is_hma_enabled", "speculative_config", "transfer_mode"}

// ParseCompatFactors reads a JSON object of exactly vLLM's factors (the
// values a real engine printed or a user wrote down) and returns the
// hash vLLM computes from them. Numbers keep the int/float distinction
// Python's JSON gives them, so the hash is the engine's to the bit.
func ParseCompatFactors(b []byte) (factors map[string]any, hash string, err error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&factors); err != nil {
		return nil, "", fmt.Errorf("compatibility factors: want a JSON object: %w", err)
	}
	if factors == nil {
		return nil, "", errors.New("compatibility factors: want a JSON object, got null")
	}
	known := map[string]bool{}
	for _, n := range CompatFactorNames {
		known[n] = true
		if _, ok := factors[n]; !ok {
			return nil, "", fmt.Errorf("compatibility factors: %q missing (vLLM hashes %s)", n, strings.Join(CompatFactorNames, ", "))
		}
	}
	for k := range factors {
		if !known[k] {
			return nil, "", fmt.Errorf("compatibility factors: %q is not one of vLLM's (%s)", k, strings.Join(CompatFactorNames, ", "))
		}
	}
	hash, err = CompatHash(factors)
	if err != nil {
		return nil, "", fmt.Errorf("compatibility factors: %w", err)
	}
	return factors, hash, nil
}
