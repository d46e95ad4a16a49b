package chat

import "fmt"

// Limits that keep a hostile template (a checkpoint's file) from running away with time or
// memory; real chat templates stay far below them. A loop of a million iterations can still
// double a string or a list twenty times over, or build a value that holds the same container
// twice at every level, whose text (and whose comparison with an equal copy) grows as 2^depth
// while the value itself stays small. So besides the loop count, each render has a budget
// of work: every byte of text it builds or scans, and itemCost for every item of a list,
// tuple or dict it builds or walks, is spent from maxWork, and a single string may not pass
// maxOutput bytes nor a list maxItems items. A walk stops where its text passes maxOutput
// (printing, tojson) or where the budget ends (==, in), so no value is expanded past them.
const (
	maxIterations = 1_000_000
	maxOutput     = 64 << 20
	maxItems      = 1_000_000
	// maxWork is 32 times the largest request body xmix serve reads (8 MiB): a template
	// touches each message a few times (8 MiB of messages cost the Llama 3 and Qwen3
	// templates 22-34 MiB; TestLargestRequestRenders).
	maxWork  = 1 << 28
	itemCost = 16
)

// budget is what one render has spent: its loop iterations and its work. A {% set %} block's
// inner render shares its parent's.
type budget struct {
	steps int
	work  int64
}

// spend charges n units of work; past maxWork the render fails.
func (b *budget) spend(n int) error {
	b.work += int64(n)
	if b.work > maxWork {
		return fmt.Errorf("the template works through more than %d MiB of values (a loop that doubles a string or a list, or a value holding the same container at every level?)", maxWork>>20)
	}
	return nil
}

// size is what building or scanning v once costs: its bytes if it is a string, itemCost an
// item if it is a list, tuple or dict; nothing for other values.
func size(v value) int {
	switch x := v.(type) {
	case string:
		return len(x)
	case list:
		return itemCost * len(x)
	case tuple:
		return itemCost * len(x)
	case *dict:
		return itemCost * len(x.keys)
	}
	return 0
}

// checkLen refuses a string of n bytes past maxOutput, before it is built.
func checkLen(n int) error {
	if n > maxOutput || n < 0 {
		return fmt.Errorf("string longer than %d bytes", maxOutput)
	}
	return nil
}

// checkItems refuses a list of n items past maxItems, before it is built.
func checkItems(n int) error {
	if n > maxItems || n < 0 {
		return fmt.Errorf("list longer than %d items", maxItems)
	}
	return nil
}
