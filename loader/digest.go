package loader

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"

	"xmix/bundle"
)

// BundleDigest identifies a bundle by content: the ranks of a tensor-parallel group compare
// it so that none runs another build (other shards, templates or weights) than the rest.
// The bundle holds no time stamp, so equal builds give equal digests.
func BundleDigest(b *bundle.Bundle) (string, error) {
	h := sha256.New()
	for i, part := range []any{b.Manifest, b.Kernels, b.Templates} {
		data, err := json.Marshal(part)
		if err != nil {
			return "", fmt.Errorf("bundle digest: section %d: %w", i, err)
		}
		writeSection(h, data)
	}
	for _, data := range [][]byte{b.Params, b.Tokenizer, b.Weights} {
		writeSection(h, data)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// writeSection hashes data after its length, so no two section splits hash alike.
func writeSection(h io.Writer, data []byte) {
	h.Write(binary.LittleEndian.AppendUint64(nil, uint64(len(data))))
	h.Write(data)
}
