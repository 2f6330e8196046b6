package canon

import (
	"bytes"
	"slices"
)

// maxDepth bounds the nesting fastJSON handles itself; deeper documents go
// to encoding/json, which has its own, higher, limit.
const maxDepth = 1000

// fastJSON returns the canonical form of b, the same bytes jsonSlow returns,
// in a single pass, in space of its own.
func fastJSON(b []byte) ([]byte, bool) {
	return new(Buffer).fastJSON(b)
}

// fastJSON returns the canonical form of in, the same bytes jsonSlow
// returns, in a single pass, in buf's space. It handles objects, arrays,
// numbers, true, false, null, and strings of printable ASCII (0x20 to 0x7e)
// without backslashes: the strings encoding/json decodes to themselves and
// writes back verbatim. It reports false for anything else, duplicate object
// keys, nesting deeper than maxDepth and every malformed document, leaving
// those to jsonSlow.
func (buf *Buffer) fastJSON(in []byte) ([]byte, bool) {
	// One slice holds the output and, after it, the scratch space for
	// reordering members; neither is ever longer than in.
	if n := 2 * len(in); cap(buf.space) < n {
		buf.space = make([]byte, n)
	}
	if buf.members == nil {
		buf.members = make([]member, 0, 16)
	}
	space := buf.space[:cap(buf.space)]
	s := scanner{in: in, out: space[:0:len(in)], tmp: space[len(in):len(in)], members: buf.members[:0]}
	ok := s.value()
	buf.members = s.members[:0] // grown, perhaps, for a deeper document
	if !ok {
		return nil, false
	}
	s.skipSpace()
	if s.pos != len(s.in) {
		return nil, false
	}
	return s.out, true
}

// A scanner reads a document from in and appends its canonical form to
// out. The output is the input without whitespace, with each object's
// members reordered, so it is never longer than the input.
type scanner struct {
	in    []byte
	pos   int // next byte of in to read
	out   []byte
	depth int

	// members holds the members of the objects being read, innermost
	// last; tmp is scratch space for reordering them.
	members []member
	tmp     []byte
}

// A member locates one object member "key":value in the output: out[key]
// is the key's opening quote, out[colon] the colon, and the value ends
// just before out[end].
type member struct {
	key, colon, end int
}

func (s *scanner) skipSpace() {
	for s.pos < len(s.in) {
		switch s.in[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// value reads one value, with the whitespace before it.
func (s *scanner) value() bool {
	s.skipSpace()
	if s.pos == len(s.in) {
		return false
	}
	switch c := s.in[s.pos]; {
	case c == '{':
		return s.object()
	case c == '[':
		return s.array()
	case c == '"':
		return s.str()
	case c == '-' || '0' <= c && c <= '9':
		return s.number()
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	}
	return false
}

func (s *scanner) literal(lit string) bool {
	if !bytes.HasPrefix(s.in[s.pos:], []byte(lit)) {
		return false
	}
	s.pos += len(lit)
	s.out = append(s.out, lit...)
	return true
}

// str reads a string made only of printable ASCII without backslashes, the
// strings that encoding/json writes back verbatim.
func (s *scanner) str() bool {
	for i := s.pos + 1; i < len(s.in); i++ {
		switch c := s.in[i]; {
		case c == '"':
			s.out = append(s.out, s.in[s.pos:i+1]...)
			s.pos = i + 1
			return true
		case c < 0x20 || c > 0x7e || c == '\\':
			return false
		}
	}
	return false
}

// number reads a number with the JSON grammar
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? and keeps its text, as a
// json.Number does.
func (s *scanner) number() bool {
	i := s.pos
	if s.in[i] == '-' {
		i++
	}
	switch {
	case i == len(s.in):
		return false
	case s.in[i] == '0':
		i++
	default:
		if i = s.digits(i); i < 0 {
			return false
		}
	}
	if i < len(s.in) && s.in[i] == '.' {
		if i = s.digits(i + 1); i < 0 {
			return false
		}
	}
	if i < len(s.in) && (s.in[i] == 'e' || s.in[i] == 'E') {
		i++
		if i < len(s.in) && (s.in[i] == '+' || s.in[i] == '-') {
			i++
		}
		if i = s.digits(i); i < 0 {
			return false
		}
	}
	s.out = append(s.out, s.in[s.pos:i]...)
	s.pos = i
	return true
}

// digits returns the offset after the run of digits starting at in[i], or
// -1 when there is none.
func (s *scanner) digits(i int) int {
	j := i
	for j < len(s.in) && '0' <= s.in[j] && s.in[j] <= '9' {
		j++
	}
	if j == i {
		return -1
	}
	return j
}

// next skips whitespace and reports whether the next byte is c, consuming
// it if so.
func (s *scanner) next(c byte) bool {
	s.skipSpace()
	if s.pos < len(s.in) && s.in[s.pos] == c {
		s.pos++
		return true
	}
	return false
}

func (s *scanner) array() bool {
	if s.depth++; s.depth > maxDepth {
		return false
	}
	s.pos++
	s.out = append(s.out, '[')
	if !s.next(']') {
		for {
			if !s.value() {
				return false
			}
			if s.next(']') {
				break
			}
			if !s.next(',') {
				return false
			}
			s.out = append(s.out, ',')
		}
	}
	s.out = append(s.out, ']')
	s.depth--
	return true
}

// object reads an object and writes its members sorted by key, as
// encoding/json writes a map[string]any. It reports false on a duplicate
// key, which encoding/json resolves by keeping the last value.
func (s *scanner) object() bool {
	if s.depth++; s.depth > maxDepth {
		return false
	}
	s.pos++
	s.out = append(s.out, '{')
	base := len(s.members)
	sorted := true
	upper := false // a key has an upper-case letter
	if !s.next('}') {
		for {
			s.skipSpace()
			if s.pos == len(s.in) || s.in[s.pos] != '"' {
				return false
			}
			m := member{key: len(s.out)}
			if !s.str() {
				return false
			}
			for _, c := range s.out[m.key+1 : len(s.out)-1] {
				if 'A' <= c && c <= 'Z' {
					upper = true
					break
				}
			}
			m.colon = len(s.out)
			if !s.next(':') {
				return false
			}
			s.out = append(s.out, ':')
			if !s.value() {
				return false
			}
			m.end = len(s.out)
			if len(s.members) > base {
				switch bytes.Compare(s.name(s.members[len(s.members)-1]), s.name(m)) {
				case 0:
					return false
				case 1:
					sorted = false
				}
			}
			s.members = append(s.members, m)
			if s.next('}') {
				break
			}
			if !s.next(',') {
				return false
			}
			s.out = append(s.out, ',')
		}
	}
	if (upper && s.foldCollide(s.members[base:])) || (!sorted && !s.reorder(s.members[base:])) {
		return false
	}
	s.members = s.members[:base]
	s.out = append(s.out, '}')
	s.depth--
	return true
}

// foldCollide reports whether two of the keys ms, all printable ASCII, are
// equal but for case; see foldCollision. (Keys without an upper-case letter
// cannot collide with one another: object checks only objects with one.)
func (s *scanner) foldCollide(ms []member) bool {
	if len(ms) > maxFoldCheck {
		return true // left to jsonSlow, which checks any number
	}
	for i := range ms {
		for j := i + 1; j < len(ms); j++ {
			if bytes.EqualFold(s.name(ms[i]), s.name(ms[j])) {
				return true
			}
		}
	}
	return false
}

// maxFoldCheck bounds the pairs foldCollide compares.
const maxFoldCheck = 32

// name returns the key of m, without its quotes.
func (s *scanner) name(m member) []byte {
	return s.out[m.key+1 : m.colon-1]
}

// reorder rewrites the members ms, which end the output, sorted by key. It
// reports false if two keys are equal.
func (s *scanner) reorder(ms []member) bool {
	slices.SortFunc(ms, func(a, b member) int {
		return bytes.Compare(s.name(a), s.name(b))
	})
	for i := 1; i < len(ms); i++ {
		if bytes.Equal(s.name(ms[i-1]), s.name(ms[i])) {
			return false
		}
	}
	first := ms[0].key
	for _, m := range ms {
		first = min(first, m.key)
	}
	s.tmp = append(s.tmp[:0], s.out[first:]...)
	s.out = s.out[:first]
	for i, m := range ms {
		if i > 0 {
			s.out = append(s.out, ',')
		}
		s.out = append(s.out, s.tmp[m.key-first:m.end-first]...)
	}
	return true
}
