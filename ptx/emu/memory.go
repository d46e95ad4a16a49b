// Package emu runs PTX kernels on the CPU, one interpreted thread at a time, so that
// generated kernels can be checked against their Go reference ops on any machine. It aims at
// the subset ptx.Validate accepts and at exact float32 results, not at speed or timing.
package emu

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
)

// Memory is a flat global address space made of separate allocations. Addresses start well
// above zero and allocations are separated by gaps, so null pointers and overruns past one
// allocation are caught rather than landing in a neighbour.
type Memory struct {
	allocs []alloc // sorted by base
	next   uint64
	// prefetched holds the address of every prefetch.global run over the memory while
	// recording (RecordReads), early every global load a thread ran before its
	// griddepcontrol.wait; blocks run in parallel, so mu guards both.
	mu         sync.Mutex
	recording  atomic.Bool
	prefetched []uint64
	early      []Span
}

// Span is n bytes at Addr.
type Span struct {
	Addr uint64
	N    int
}

type alloc struct {
	base uint64
	data []byte
}

// NewMemory returns an empty address space.
func NewMemory() *Memory { return &Memory{next: 1 << 16} }

// Alloc reserves n zeroed bytes and returns their address, aligned to 256 bytes.
func (m *Memory) Alloc(n int) uint64 {
	n = max(n, 0)
	base := m.next
	m.allocs = append(m.allocs, alloc{base: base, data: make([]byte, n)})
	m.next = (base + uint64(n) + 256 + 255) &^ 255
	return base
}

// Bytes is the view from addr to the end of its allocation, nil when addr is in none.
func (m *Memory) Bytes(addr uint64) []byte {
	a := m.find(addr)
	if a == nil {
		return nil
	}
	return a.data[addr-a.base:]
}

func (m *Memory) find(addr uint64) *alloc {
	i := sort.Search(len(m.allocs), func(i int) bool { return m.allocs[i].base > addr }) - 1
	if i < 0 {
		return nil
	}
	a := &m.allocs[i]
	if addr-a.base > uint64(len(a.data)) || addr-a.base == uint64(len(a.data)) && len(a.data) > 0 {
		return nil
	}
	return a
}

// RecordReads starts keeping the address of every prefetch.global that kernels run over m
// issue (a prefetch changes no result, so this is how a test sees what a kernel asks L2 for)
// and the span of every global load a thread runs before its griddepcontrol.wait (what a
// kernel launched early reads while the grid ahead may still write), forgetting those kept
// before.
func (m *Memory) RecordReads() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.recording.Store(true)
	m.prefetched, m.early = nil, nil
}

// EarlyLoads is the global loads run before a thread's griddepcontrol.wait since
// RecordReads, in no particular order across threads.
func (m *Memory) EarlyLoads() []Span {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Span(nil), m.early...)
}

func (m *Memory) loadEarly(addr uint64, n int) {
	if m.recording.Load() {
		m.mu.Lock()
		m.early = append(m.early, Span{addr, n})
		m.mu.Unlock()
	}
}

// Prefetched is the addresses prefetched since RecordReads, in no particular order
// across threads.
func (m *Memory) Prefetched() []uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]uint64(nil), m.prefetched...)
}

// prefetch checks that a prefetch's address lies in an allocation (on the GPU a hint to a
// wrong address is dropped silently; here it is the bug it shows) and records it.
func (m *Memory) prefetch(addr uint64) error {
	if m.find(addr) == nil {
		return fmt.Errorf("prefetch at 0x%x is outside every allocation", addr)
	}
	if m.recording.Load() {
		m.mu.Lock()
		m.prefetched = append(m.prefetched, addr)
		m.mu.Unlock()
	}
	return nil
}

// span returns the n bytes at addr, checking bounds and natural alignment of size align.
// last caches the allocation hit before, since a thread mostly touches the same few buffers.
func (m *Memory) span(addr uint64, n, align int, last **alloc) ([]byte, error) {
	if addr%uint64(align) != 0 {
		return nil, fmt.Errorf("misaligned %d-byte global access at 0x%x", n, addr)
	}
	a := *last
	if a == nil || addr < a.base || addr-a.base+uint64(n) > uint64(len(a.data)) {
		a = m.find(addr)
		if a == nil || addr-a.base+uint64(n) > uint64(len(a.data)) {
			return nil, fmt.Errorf("global access of %d bytes at 0x%x is outside every allocation", n, addr)
		}
		*last = a
	}
	off := addr - a.base
	return a.data[off : off+uint64(n)], nil
}
