package rendezvous

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"
)

// MaxFrame bounds one frame's payload: a peer that sends a larger length is broken or is not
// an xmix rank, and must not make this process allocate it.
const MaxFrame = 1 << 30

// Frame kinds below FirstUserKind belong to the rendezvous; callers pick theirs from it up.
const FirstUserKind = 16

// handshakeLimit bounds a frame before the welcome; hellos and welcomes are far smaller.
const handshakeLimit = 1 << 16

// errTooLarge is a frame length over the link's limit.
var errTooLarge = errors.New("frame over the size limit")

const (
	kindHello   = 1
	kindWelcome = 2
	kindRefuse  = 3
)

// Link is a framed connection to one peer rank: each frame is a kind byte, a little-endian
// u32 payload length and the payload. Sends are buffered until Flush, so a burst of small
// frames (control writes, then a step) costs one packet. Every error names the peer.
type Link struct {
	// Peer names the other end for errors: "rank 1 at 10.0.0.2:51234".
	Peer string
	// limit bounds the payloads Recv accepts: small during the handshake, where a stray
	// client's bytes must not read as a huge length, MaxFrame after.
	limit uint32
	conn  net.Conn
	r     *bufio.Reader
	w     *bufio.Writer
}

func newLink(conn net.Conn, peer string) *Link {
	return &Link{Peer: peer, limit: handshakeLimit, conn: conn, r: bufio.NewReaderSize(conn, 1<<16), w: bufio.NewWriterSize(conn, 1<<16)}
}

// Send queues one frame whose payload is the concatenation of parts.
func (l *Link) Send(kind byte, parts ...[]byte) error {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	if n > MaxFrame {
		return fmt.Errorf("%s: frame of %d bytes exceeds the %d-byte limit", l.Peer, n, MaxFrame)
	}
	var hdr [5]byte
	hdr[0] = kind
	binary.LittleEndian.PutUint32(hdr[1:], uint32(n))
	if _, err := l.w.Write(hdr[:]); err != nil {
		return l.wrap("send", err)
	}
	for _, p := range parts {
		if _, err := l.w.Write(p); err != nil {
			return l.wrap("send", err)
		}
	}
	return nil
}

// Flush sends every queued frame.
func (l *Link) Flush() error {
	return l.wrap("send", l.w.Flush())
}

// Recv reads the next frame, waiting until deadline (the zero time: no limit).
func (l *Link) Recv(deadline time.Time) (kind byte, payload []byte, err error) {
	if err := l.conn.SetReadDeadline(deadline); err != nil {
		return 0, nil, l.wrap("receive", err)
	}
	var hdr [5]byte
	if _, err := io.ReadFull(l.r, hdr[:]); err != nil {
		return 0, nil, l.wrap("receive", err)
	}
	n := binary.LittleEndian.Uint32(hdr[1:])
	if n > l.limit {
		return 0, nil, fmt.Errorf("%s: announced a frame of %d bytes, over the %d-byte limit (not an xmix rank?): %w", l.Peer, n, l.limit, errTooLarge)
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(l.r, payload); err != nil {
		return 0, nil, l.wrap("receive", err)
	}
	return hdr[0], payload, nil
}

// Post sends one frame now: Send, then Flush.
func (l *Link) Post(kind byte, parts ...[]byte) error {
	if err := l.Send(kind, parts...); err != nil {
		return err
	}
	return l.Flush()
}

// Close closes the connection; the peer's next Recv fails with io.EOF.
func (l *Link) Close() error { return l.conn.Close() }

// wrap says which peer and which direction failed, and turns the two failures a caller must
// tell apart (the peer left, the peer is silent) into plain words.
func (l *Link) wrap(what string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("%s closed the connection (%s: %w)", l.Peer, what, err)
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("%s: %s timed out: %w", l.Peer, what, err)
	}
	return fmt.Errorf("%s: %s: %w", l.Peer, what, err)
}
