package serve

import "strings"

// stopMatcher finds a request's stop strings in its generated text, across token
// boundaries: text that could be the start of a stop string is held back until the next
// tokens show whether it is, so nothing released ever has to be taken back.
type stopMatcher struct {
	stops       []string
	includeStop bool   // release the stop string itself (vLLM's include_stop_str_in_output)
	held        string // decoded, not yet released
	matched     string // the stop string found, once found
	// unarmed: the request's min_tokens are not generated yet, so no stop string may end
	// it; text that could start one is still held, so one that ends after them is found.
	unarmed bool
}

// feed adds generated text and returns what can be released. Once a stop string is found,
// the release ends where it starts (or after it, with includeStop) and matched is set.
func (m *stopMatcher) feed(s string) string {
	if len(m.stops) == 0 || m.matched != "" {
		return s
	}
	m.held += s
	at := -1
	for _, st := range m.stops {
		if m.unarmed {
			break
		}
		if i := strings.Index(m.held, st); i >= 0 && (at < 0 || i < at || i == at && len(st) > len(m.matched)) {
			at, m.matched = i, st
		}
	}
	if at >= 0 {
		out := m.held[:at]
		if m.includeStop {
			out += m.matched
		}
		m.held = ""
		return out
	}
	// Hold the longest end of the text that is the start of a stop string.
	keep := 0
	for _, st := range m.stops {
		for l := min(len(st)-1, len(m.held)); l > keep; l-- {
			if strings.HasSuffix(m.held, st[:l]) {
				keep = l
				break
			}
		}
	}
	out := m.held[:len(m.held)-keep]
	m.held = m.held[len(m.held)-keep:]
	return out
}

// flush releases what is held: the generation ended without completing a stop string.
func (m *stopMatcher) flush() string {
	out := m.held
	m.held = ""
	return out
}
