package kv

import (
	"fmt"
	"strings"
)

// DType is the element type of the KV cache.
type DType string

// Cache element types the engines use.
const (
	FP8  DType = "fp8"
	BF16 DType = "bf16"
	FP16 DType = "fp16"
	FP32 DType = "fp32"
)

// Bytes is the size of one element.
func (d DType) Bytes() int {
	switch d {
	case FP8:
		return 1
	case BF16, FP16:
		return 2
	case FP32:
		return 4
	}
	return 0
}

// dtypeAliases maps the spellings found in HuggingFace configs and engine
// flags (torch_dtype, --kv-cache-dtype) to a DType.
var dtypeAliases = map[string]DType{
	"fp8": FP8, "fp8_e4m3": FP8, "fp8_e5m2": FP8, "float8_e4m3fn": FP8, "float8_e5m2": FP8, "float8": FP8, "int8": FP8,
	"bf16": BF16, "bfloat16": BF16,
	"fp16": FP16, "float16": FP16, "half": FP16,
	"fp32": FP32, "float32": FP32, "float": FP32,
}

// ParseDType accepts the usual spellings (bf16, bfloat16, torch.bfloat16, fp8_e4m3, ...).
func ParseDType(s string) (DType, error) {
	k := strings.ToLower(strings.TrimSpace(s))
	k = strings.TrimPrefix(k, "torch.")
	if d, ok := dtypeAliases[k]; ok {
		return d, nil
	}
	return "", fmt.Errorf("unknown dtype %q (want one of fp8, bf16, fp16, fp32)", s)
}
