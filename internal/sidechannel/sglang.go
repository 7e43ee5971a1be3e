package sidechannel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nixlctl/nixlctl/internal/kv"
)

// SGLang's NIXL disaggregation wire codec, beside vLLM's (vllm.go): the
// ZMQ frames decode sends a prefill rank's PULL inbox (the once-per-peer
// KV-args registration, a TransferInfo per request, ABORT) and the
// notification strings prefill's WRITEs carry. internal/engine runs the
// protocol (bootstrap server, inboxes, WRITEs); internal/sglrooms keeps
// its rooms.

// SGLGuard opens every decode->prefill message except ABORT.
const SGLGuard = "NixlMsgGuard"

// SGLAuxRows is the aux rows decode has, one per request in flight: an
// aux index in a TransferInfo is below it.
const SGLAuxRows = 1024

// SGLRegistration is decode's once-per-peer KV-args message.
type SGLRegistration struct {
	DecodeIP   string
	DecodePort int
	AgentName  string
	AgentMD    []byte
	KVPtrs     []uint64 // one per region (K layers then V layers, or latents)
	AuxPtrs    []uint64
	GPUID      int
	DecodeTP   int
	DecodeRank int
	KVItemLen  int64 // bytes of one page of one region
	// DstNumSlots, pages in decode's pool, is nixlctl's addition: an 18th
	// frame SGLang's receiver ignores (it reads fixed positions), sent only
	// when set; 0 when absent (a real SGLang decode), meaning unbounded.
	DstNumSlots int
}

// SGLTransferInfo is decode's per-request message.
type SGLTransferInfo struct {
	Room        uint64
	DecodeIP    string
	DecodePort  int
	AgentName   string
	DstPages    []int32
	DstAux      int
	RequiredDst int
	PrefixLen   int
}

// Encode builds the ZMQ frames of a KV-args registration as SGLang's
// _register_kv_args does: the guard, then 16 frames (no state buffers, no
// staging), then nixlctl's dst_num_slots when set.
func (r SGLRegistration) Encode() [][]byte {
	f := [][]byte{[]byte(SGLGuard), []byte("None"), []byte(r.DecodeIP), []byte(strconv.Itoa(r.DecodePort)),
		[]byte(r.AgentName), r.AgentMD, packU64(r.KVPtrs), packU64(r.AuxPtrs), {}, []byte(strconv.Itoa(r.GPUID)),
		[]byte(strconv.Itoa(r.DecodeTP)), []byte(strconv.Itoa(r.DecodeRank)), []byte(strconv.FormatInt(r.KVItemLen, 10)),
		{}, {}, {}, {}}
	if r.DstNumSlots > 0 {
		f = append(f, []byte(strconv.Itoa(r.DstNumSlots)))
	}
	return f
}

// SGLAbort is decode's best-effort ABORT of a room (common/conn.py's
// _send_abort_notification): no guard frame; room, decode ip and port.
func SGLAbort(room uint64, ip string, port int) [][]byte {
	return [][]byte{[]byte("ABORT"), []byte(strconv.FormatUint(room, 10)), []byte(ip), []byte(strconv.Itoa(port))}
}

// Encode builds the ZMQ frames of a TransferInfo.
func (t SGLTransferInfo) Encode() [][]byte {
	pages := make([]byte, 4*len(t.DstPages))
	for i, p := range t.DstPages {
		binary.LittleEndian.PutUint32(pages[4*i:], uint32(p))
	}
	return [][]byte{[]byte(SGLGuard), []byte(strconv.FormatUint(t.Room, 10)), []byte(t.DecodeIP), []byte(strconv.Itoa(t.DecodePort)),
		[]byte(t.AgentName), pages, []byte(strconv.Itoa(t.DstAux)), []byte(strconv.Itoa(t.RequiredDst)), {},
		[]byte(strconv.Itoa(t.PrefixLen))}
}

func packU64(xs []uint64) []byte {
	b := make([]byte, 8*len(xs))
	for i, x := range xs {
		binary.LittleEndian.PutUint64(b[8*i:], x)
	}
	return b
}

func unpackU64(b []byte) ([]uint64, error) {
	if len(b)%8 != 0 {
		return nil, fmt.Errorf("%d bytes is not a list of u64", len(b))
	}
	out := make([]uint64, len(b)/8)
	for i := range out {
		out[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return out, nil
}

func atoiFrame(b []byte, what string, lo, hi int) (int, error) {
	n, err := strconv.Atoi(string(b))
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s: %q is not an integer in [%d, %d]", what, b, lo, hi)
	}
	return n, nil
}

// DecodeSGLMessage parses a message received on a prefill rank's PULL
// inbox: a registration (room "None"), a TransferInfo, or an ABORT.
func DecodeSGLMessage(frames [][]byte) (reg *SGLRegistration, info *SGLTransferInfo, abort uint64, err error) {
	if len(frames) >= 2 && string(frames[0]) == "ABORT" {
		room, err := strconv.ParseUint(string(frames[1]), 10, 64)
		if err != nil {
			return nil, nil, 0, fmt.Errorf("ABORT: room %q", frames[1])
		}
		return nil, nil, room, nil
	}
	if len(frames) < 2 || string(frames[0]) != SGLGuard {
		return nil, nil, 0, errors.New("no guard frame (foreign traffic?)")
	}
	f := frames[1:]
	if string(f[0]) == "None" {
		if len(f) < 13 {
			return nil, nil, 0, fmt.Errorf("registration has %d frames, want at least 13", len(f))
		}
		r := &SGLRegistration{DecodeIP: string(f[1]), AgentName: string(f[3]), AgentMD: append([]byte(nil), f[4]...)}
		if r.DecodePort, err = atoiFrame(f[2], "decode port", 1, 65535); err != nil {
			return nil, nil, 0, err
		}
		if r.KVPtrs, err = unpackU64(f[5]); err != nil || len(r.KVPtrs) == 0 {
			return nil, nil, 0, fmt.Errorf("kv_data_ptrs: %v", err)
		}
		if r.AuxPtrs, err = unpackU64(f[6]); err != nil {
			return nil, nil, 0, fmt.Errorf("aux_data_ptrs: %w", err)
		}
		if r.GPUID, err = atoiFrame(f[8], "gpu id", 0, 1<<20); err != nil {
			return nil, nil, 0, err
		}
		if r.DecodeTP, err = atoiFrame(f[9], "decode tp size", 1, 1024); err != nil {
			return nil, nil, 0, err
		}
		if r.DecodeRank, err = atoiFrame(f[10], "decode rank", 0, 1023); err != nil {
			return nil, nil, 0, err
		}
		item, err := atoiFrame(f[11], "kv item len", 1, 1<<30)
		if err != nil {
			return nil, nil, 0, err
		}
		r.KVItemLen = int64(item)
		if len(f) > 16 && len(f[16]) > 0 {
			if r.DstNumSlots, err = atoiFrame(f[16], "dst num slots", 1, 1<<30); err != nil {
				return nil, nil, 0, err
			}
		}
		if r.AgentName == "" {
			return nil, nil, 0, errors.New("registration without an agent name")
		}
		return r, nil, 0, nil
	}
	if len(f) < 8 {
		return nil, nil, 0, fmt.Errorf("transfer info has %d frames, want at least 8", len(f))
	}
	t := &SGLTransferInfo{DecodeIP: string(f[1]), AgentName: string(f[3])}
	if t.Room, err = strconv.ParseUint(string(f[0]), 10, 64); err != nil {
		return nil, nil, 0, fmt.Errorf("room %q is not a number", f[0])
	}
	if t.DecodePort, err = atoiFrame(f[2], "decode port", 1, 65535); err != nil {
		return nil, nil, 0, err
	}
	if len(f[4])%4 != 0 {
		return nil, nil, 0, fmt.Errorf("page indices: %d bytes is not a list of int32", len(f[4]))
	}
	for i := 0; i < len(f[4]); i += 4 {
		p := int32(binary.LittleEndian.Uint32(f[4][i:]))
		if p < 0 {
			return nil, nil, 0, fmt.Errorf("negative page index %d", p)
		}
		t.DstPages = append(t.DstPages, p)
	}
	if t.DstAux, err = atoiFrame(f[5], "aux index", 0, SGLAuxRows-1); err != nil {
		return nil, nil, 0, err
	}
	if t.RequiredDst, err = atoiFrame(f[6], "required dst info num", 1, 1024); err != nil {
		return nil, nil, 0, err
	}
	if len(f) > 8 && len(f[8]) > 0 {
		if t.PrefixLen, err = atoiFrame(f[8], "decode prefix len", 0, kv.MaxTokens); err != nil {
			return nil, nil, 0, err
		}
	}
	return nil, t, 0, nil
}

// SGLNotif is a parsed decode-side notification.
type SGLNotif struct {
	Room   uint64
	Kind   string // kv, aux, nokv
	Chunk  int
	Last   bool
	Sender int
}

// SGLKVNotif tags a KV chunk's WRITE: "{room}_kv_{chunk}_{0|1}_{sender}".
func SGLKVNotif(room uint64, chunk int, last bool, sender int) []byte {
	return []byte(fmt.Sprintf("%d_kv_%d_%d_%d", room, chunk, b2i(last), sender))
}

// SGLAuxNotif tags the aux row's WRITE: "{room}_aux".
func SGLAuxNotif(room uint64) []byte { return []byte(fmt.Sprintf("%d_aux", room)) }

// SGLNoKVNotif ends a room a sender has no pages for: "{room}_aux_nokv_{sender}".
func SGLNoKVNotif(room uint64, sender int) []byte {
	return []byte(fmt.Sprintf("%d_aux_nokv_%d", room, sender))
}

func IsSGLangNotif(m string) bool { _, err := ParseSGLNotif(m); return err == nil }

func ParseSGLNotif(m string) (SGLNotif, error) {
	parts := strings.Split(m, "_")
	var n SGLNotif
	if len(parts) < 2 {
		return n, errors.New("not an SGLang notification")
	}
	room, err := strconv.ParseUint(parts[0], 10, 64)
	if err != nil {
		return n, errors.New("not an SGLang notification")
	}
	n.Room = room
	switch {
	case parts[1] == "kv" && len(parts) == 5:
		n.Kind = "kv"
		if n.Chunk, err = strconv.Atoi(parts[2]); err != nil || n.Chunk < 0 {
			return n, fmt.Errorf("chunk id %q", parts[2])
		}
		if parts[3] != "0" && parts[3] != "1" {
			return n, fmt.Errorf("is_last %q", parts[3])
		}
		n.Last = parts[3] == "1"
		if n.Sender, err = strconv.Atoi(parts[4]); err != nil || n.Sender < 0 || n.Sender > 1023 {
			return n, fmt.Errorf("sender %q", parts[4])
		}
	case parts[1] == "aux" && len(parts) == 2:
		n.Kind = "aux"
	case parts[1] == "aux" && len(parts) == 4 && parts[2] == "nokv":
		n.Kind = "nokv"
		if n.Sender, err = strconv.Atoi(parts[3]); err != nil || n.Sender < 0 || n.Sender > 1023 {
			return n, fmt.Errorf("sender %q", parts[3])
		}
	default:
		return n, fmt.Errorf("unknown SGLang notification %q", m)
	}
	return n, nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
