package recipes

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Strict decoding. yaml.v3's own Decoder.KnownFields reports unknown fields
// with a line but no column, stops at the first type error and cannot suggest
// a spelling, so kiln walks the yaml.Node tree itself, driven by the yaml
// struct tags of the target type. Every value's position is remembered under
// its field path ("images[0].name") so validation can point at it later.

// position is where a value starts in the file (1-based).
type position struct{ line, col int }

// document collects the positions and problems of one file being decoded.
type document struct {
	file string
	pos  map[string]position
	errs ErrorList
}

func newDocument(file string) *document {
	return &document{file: file, pos: map[string]position{}}
}

// errorAt records a problem at node n.
func (d *document) errorAt(n *yaml.Node, field, format string, args ...any) {
	d.errs = append(d.errs, &Error{File: d.file, Line: n.Line, Column: n.Column, Field: field, Msg: fmt.Sprintf(format, args...)})
}

// errorf records a problem with field, placed at the field's value or, when
// the field is absent, at the nearest enclosing value that is present.
func (d *document) errorf(field, format string, args ...any) {
	p := d.lookup(field)
	d.errs = append(d.errs, &Error{File: d.file, Line: p.line, Column: p.col, Field: field, Msg: fmt.Sprintf(format, args...)})
}

// lookup finds the position of field or of its nearest present ancestor.
func (d *document) lookup(field string) position {
	for {
		if p, ok := d.pos[field]; ok {
			return p
		}
		if field == "" {
			return position{} // nothing decoded (a lock built in code): no position
		}
		field = parentField(field)
	}
}

// has reports whether field was written in the file (even as null).
func (d *document) has(field string) bool {
	_, ok := d.pos[field]
	return ok
}

// parentField strips the last ".name" or "[i]" from a field path.
func parentField(field string) string {
	i := strings.LastIndexAny(field, ".[")
	if i < 0 {
		return ""
	}
	return field[:i]
}

func joinField(parent, name string) string {
	if parent == "" {
		return name
	}
	return parent + "." + name
}

// yamlLineError matches yaml.v3 syntax errors, which carry a line but no column.
var yamlLineError = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// parse reads exactly one YAML document from data and returns its root
// mapping. On failure it returns nil and the problem is in d.errs.
func (d *document) parse(data []byte, what string) *yaml.Node {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var root yaml.Node
	err := dec.Decode(&root)
	if errors.Is(err, io.EOF) || (err == nil && len(root.Content) == 0) {
		d.errs = append(d.errs, &Error{File: d.file, Line: 1, Column: 1, Msg: fmt.Sprintf("the file is empty; %s", what)})
		return nil
	}
	if err != nil {
		d.syntaxError(data, err)
		return nil
	}
	// Further documents: empty ones (a trailing "---") are harmless; any
	// content is an error, since it would be silently ignored.
	for {
		var extra yaml.Node
		err := dec.Decode(&extra)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			d.syntaxError(data, err)
			return nil
		}
		if len(extra.Content) == 0 || isNull(extra.Content[0]) {
			continue
		}
		d.errorAt(extra.Content[0], "", "a second YAML document (after a '---' line) starts here; the file must hold exactly one")
		return nil
	}
	top := root.Content[0]
	if top.Kind != yaml.MappingNode {
		d.errorAt(top, "", "expected a mapping of fields (apiVersion: …, kind: …), got %s", describe(top))
		return nil
	}
	return top
}

// syntaxError turns a yaml.v3 parse error into an *Error with its line, and
// adds a hint for the most common cause, tab indentation.
func (d *document) syntaxError(data []byte, err error) {
	e := &Error{File: d.file, Msg: strings.TrimPrefix(err.Error(), "yaml: ")}
	if m := yamlLineError.FindStringSubmatch(err.Error()); m != nil {
		e.Line, _ = strconv.Atoi(m[1])
		e.Msg = m[2]
	}
	if strings.Contains(e.Msg, "cannot start any token") && lineHasTab(data, e.Line) {
		e.Msg += " (a tab: indent YAML with spaces, not tabs)"
	}
	e.Msg = "invalid YAML: " + e.Msg
	d.errs = append(d.errs, e)
}

func lineHasTab(data []byte, line int) bool {
	lines := bytes.Split(data, []byte("\n"))
	return line >= 1 && line <= len(lines) && bytes.Contains(lines[line-1], []byte("\t"))
}

// describe names what a node is, for "expected X, got Y" messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping (key: value lines)"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	if isNull(n) {
		return "nothing"
	}
	return strconv.Quote(n.Value)
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// field returns the value node of a key in mapping n, or nil.
func field(n *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := n.Content[i]; k.Kind == yaml.ScalarNode && k.Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// wrongKind reports a file of another kind (a lock given as a recipe, or
// the reverse) as that one problem, instead of a list of unknown fields.
func (d *document) wrongKind(top *yaml.Node, other, msg string) bool {
	k := field(top, "kind")
	if k == nil || k.Kind != yaml.ScalarNode || k.Value != other {
		return false
	}
	d.errorAt(k, "kind", "%s", msg)
	return true
}

var unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()

// decode fills v (addressable) from n. A null leaves v as it is, so that
// "field:" with no value means "use the default".
func (d *document) decode(n *yaml.Node, v reflect.Value, field string) {
	d.pos[field] = position{n.Line, n.Column}
	if n.Kind == yaml.AliasNode {
		d.errorAt(n, field, "YAML aliases (*%s) are not supported here; write the value out in full", n.Value)
		return
	}
	if isNull(n) {
		return
	}
	if reflect.PointerTo(v.Type()).Implements(unmarshalerType) {
		if err := v.Addr().Interface().(yaml.Unmarshaler).UnmarshalYAML(n); err != nil {
			d.errorAt(n, field, "%v", err)
		}
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		d.decode(n, p.Elem(), field)
		v.Set(p)
	case reflect.Struct:
		d.decodeStruct(n, v, field)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.errorAt(n, field, "expected a list (one '- item' per line), got %s", describe(n))
			return
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, item := range n.Content {
			d.decode(item, s.Index(i), fmt.Sprintf("%s[%d]", field, i))
		}
		v.Set(s)
	case reflect.String:
		if n.Kind != yaml.ScalarNode {
			d.errorAt(n, field, "expected a single value, got %s", describe(n))
			return
		}
		// Any scalar is taken as written: "version: 1.10" stays "1.10".
		v.SetString(n.Value)
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" {
			d.errorAt(n, field, "expected true or false, got %s", describe(n))
			return
		}
		v.SetBool(strings.EqualFold(n.Value, "true"))
	case reflect.Int, reflect.Int64:
		var i int64
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || n.Decode(&i) != nil || v.OverflowInt(i) {
			d.errorAt(n, field, "expected a whole number, got %s", describe(n))
			return
		}
		v.SetInt(i)
	default:
		panic("recipes: no YAML decoding for " + v.Type().String())
	}
}

// decodeStruct fills struct v from mapping n, refusing unknown and repeated
// fields.
func (d *document) decodeStruct(n *yaml.Node, v reflect.Value, field string) {
	if n.Kind != yaml.MappingNode {
		d.errorAt(n, field, "expected a mapping (key: value lines), got %s", describe(n))
		return
	}
	names, index := yamlFields(v.Type())
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			d.errorAt(k, field, "expected a field name, got %s", describe(k))
			continue
		}
		sub := joinField(field, k.Value)
		if line, dup := seen[k.Value]; dup {
			d.errorAt(k, sub, "field given twice (first on line %d); keep one", line)
			continue
		}
		seen[k.Value] = k.Line
		fi, ok := index[k.Value]
		if !ok {
			d.errorAt(k, sub, "%s", unknownField(k.Value, names))
			continue
		}
		d.decode(val, v.Field(fi), sub)
	}
}

// yamlFields lists the YAML names of t's fields, in declaration order, and
// maps each to its field index.
func yamlFields(t reflect.Type) ([]string, map[string]int) {
	var names []string
	index := map[string]int{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "-" || name == "" {
			continue
		}
		names = append(names, name)
		index[name] = i
	}
	return names, index
}

// unknownField explains an unknown field: the closest valid name if one is
// near enough to be a typo, otherwise every valid name.
func unknownField(key string, valid []string) string {
	if key == "<<" {
		return "YAML merge keys (<<) are not supported; write the fields out in full"
	}
	best, bestDist := "", len(key)/3+2
	for _, v := range valid {
		if strings.EqualFold(v, key) {
			return fmt.Sprintf("unknown field; did you mean %q? (field names are case-sensitive)", v)
		}
		if dist := levenshtein(strings.ToLower(key), strings.ToLower(v)); dist < bestDist {
			best, bestDist = v, dist
		}
	}
	if best != "" {
		return fmt.Sprintf("unknown field; did you mean %q?", best)
	}
	sorted := append([]string(nil), valid...)
	sort.Strings(sorted)
	return fmt.Sprintf("unknown field; valid fields here are %s", strings.Join(sorted, ", "))
}

// levenshtein is the edit distance between a and b (bytes; field names are ASCII).
func levenshtein(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
