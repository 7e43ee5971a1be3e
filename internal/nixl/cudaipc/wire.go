package cudaipc

import (
	"encoding/binary"
	"fmt"

	"github.com/nixlctl/nixlctl/internal/nixl"
	"github.com/nixlctl/nixlctl/internal/nixl/cuda"
)

// What a cuda-ipc agent puts into nixl.Metadata. Both blobs are versioned
// and length-checked: a peer's metadata is outside input.
//
// Conn:  "CIPC" | version u8 | device i32 | u16 len + notification socket
//        name | u16 len + GPU UUID
// Key:   "CIPK" | version u8 | offset u64 | allocation size u64 | 64-byte
//        CUDA IPC handle of the allocation that holds the region
//
// A region is exported as (handle, offset) because IPC handles name whole
// cuMemAlloc allocations, and a registered buffer may be part of one.

const (
	connMagic   = "CIPC"
	keyMagic    = "CIPK"
	wireVersion = 1
	keyLen      = 4 + 1 + 8 + 8 + 64
	maxSockName = 108 // sun_path
	maxUUID     = 64
)

// connInfo is how peers reach an agent.
type connInfo struct {
	Sock string // abstract unix socket for notifications, "@..."
	Dev  int32  // the agent's GPU in its own process's numbering; -1 before it registered memory
	UUID string // that GPU's UUID, comparable across processes
}

func encodeConn(c connInfo) []byte {
	b := append([]byte(connMagic), wireVersion)
	b = binary.LittleEndian.AppendUint32(b, uint32(c.Dev))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(c.Sock)))
	b = append(b, c.Sock...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(c.UUID)))
	return append(b, c.UUID...)
}

func decodeConn(b []byte) (connInfo, error) {
	bad := func(format string, a ...any) (connInfo, error) {
		return connInfo{}, fmt.Errorf("%w: cuda-ipc connection info: %s", nixl.ErrBadMetadata, fmt.Sprintf(format, a...))
	}
	if len(b) < 4+1+4+2 || string(b[:4]) != connMagic {
		return bad("not cuda-ipc connection info")
	}
	if b[4] != wireVersion {
		return bad("version %d, this nixlctl reads %d", b[4], wireVersion)
	}
	c := connInfo{Dev: int32(binary.LittleEndian.Uint32(b[5:]))}
	rest := b[9:]
	str := func(limit int) (string, bool) {
		if len(rest) < 2 {
			return "", false
		}
		n := int(binary.LittleEndian.Uint16(rest))
		if n > limit || len(rest) < 2+n {
			return "", false
		}
		s := string(rest[2 : 2+n])
		rest = rest[2+n:]
		return s, true
	}
	var ok bool
	if c.Sock, ok = str(maxSockName); !ok || len(c.Sock) < 2 || c.Sock[0] != '@' {
		return bad("bad notification socket name")
	}
	if c.UUID, ok = str(maxUUID); !ok {
		return bad("bad GPU UUID")
	}
	if len(rest) != 0 {
		return bad("%d trailing bytes", len(rest))
	}
	if c.Dev < -1 {
		return bad("device %d", c.Dev)
	}
	return c, nil
}

// ipcKey locates a region inside an exported allocation.
type ipcKey struct {
	Offset uint64 // of the region's start in the allocation
	Size   uint64 // of the allocation
	Handle cuda.IPCHandle
}

func encodeKey(k ipcKey) []byte {
	b := append([]byte(keyMagic), wireVersion)
	b = binary.LittleEndian.AppendUint64(b, k.Offset)
	b = binary.LittleEndian.AppendUint64(b, k.Size)
	return append(b, k.Handle[:]...)
}

// decodeKey parses a region's key and checks that the region (regionLen
// bytes) lies inside the allocation, so every address derived from it
// stays inside what the handle maps.
func decodeKey(b []byte, regionLen uint64) (ipcKey, error) {
	bad := func(format string, a ...any) (ipcKey, error) {
		return ipcKey{}, fmt.Errorf("%w: cuda-ipc region key: %s", nixl.ErrBadMetadata, fmt.Sprintf(format, a...))
	}
	if len(b) != keyLen || string(b[:4]) != keyMagic {
		return bad("not a cuda-ipc key (%d bytes)", len(b))
	}
	if b[4] != wireVersion {
		return bad("version %d, this nixlctl reads %d", b[4], wireVersion)
	}
	k := ipcKey{Offset: binary.LittleEndian.Uint64(b[5:]), Size: binary.LittleEndian.Uint64(b[13:])}
	copy(k.Handle[:], b[21:])
	if k.Size == 0 || k.Offset > k.Size || regionLen > k.Size-k.Offset {
		return bad("region of %d bytes at offset %d does not fit its %d-byte allocation", regionLen, k.Offset, k.Size)
	}
	return k, nil
}

// Notification messages on the socket: u16 sender name length | sender
// name | payload, one message per notification (SOCK_SEQPACKET keeps the
// boundaries).

const maxNotif = 64 << 10

func encodeNotif(sender string, msg []byte) []byte {
	b := binary.LittleEndian.AppendUint16(make([]byte, 0, 2+len(sender)+len(msg)), uint16(len(sender)))
	b = append(b, sender...)
	return append(b, msg...)
}

func decodeNotif(b []byte) (sender string, msg []byte, err error) {
	if len(b) < 2 {
		return "", nil, fmt.Errorf("notification of %d bytes", len(b))
	}
	n := int(binary.LittleEndian.Uint16(b))
	if n == 0 || n > 255 || len(b) < 2+n {
		return "", nil, fmt.Errorf("sender name of %d bytes in a %d-byte notification", n, len(b))
	}
	return string(b[2 : 2+n]), append([]byte(nil), b[2+n:]...), nil
}
