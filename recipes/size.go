package recipes

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// sizeUnits maps each accepted unit to its factor. One-letter units and the
// IEC "iB" units are binary; the SI "B" units are decimal, as on drive labels.
var sizeUnits = map[string]int64{
	"B": 1,
	"K": 1 << 10, "KiB": 1 << 10, "KB": 1e3,
	"M": 1 << 20, "MiB": 1 << 20, "MB": 1e6,
	"G": 1 << 30, "GiB": 1 << 30, "GB": 1e9,
	"T": 1 << 40, "TiB": 1 << 40, "TB": 1e12,
}

// ParseSize parses "auto", "fit", a plain number of bytes ("1048576") or a
// whole number with a unit ("8GiB", "512 MiB", "16G", "4GB").
func ParseSize(s string) (Size, error) {
	s = strings.TrimSpace(s)
	switch s {
	case "auto", "fit":
		return Size{Auto: true}, nil
	case "":
		return Size{}, errors.New(`empty size; write "auto" or a size such as "8GiB"`)
	}
	digits := strings.IndexFunc(s, func(r rune) bool { return r < '0' || r > '9' })
	if digits < 0 {
		digits = len(s)
	}
	num, unit := s[:digits], strings.TrimSpace(s[digits:])
	switch {
	case strings.HasPrefix(s, "-"):
		return Size{}, fmt.Errorf("size %q is negative; sizes must be greater than zero", s)
	case num == "":
		if strings.EqualFold(s, "auto") || strings.EqualFold(s, "fit") {
			return Size{}, fmt.Errorf("size %q: write %q in lower case", s, strings.ToLower(s))
		}
		return Size{}, fmt.Errorf("size %q is not a size; write \"auto\" or a whole number with a unit such as \"8GiB\"", s)
	case strings.HasPrefix(unit, ".") || strings.HasPrefix(unit, ","):
		return Size{}, fmt.Errorf("size %q: use a whole number with a smaller unit (e.g. 1536MiB, not 1.5GiB)", s)
	}
	factor := int64(1)
	if unit != "" {
		f, ok := sizeUnits[unit]
		if !ok {
			return Size{}, fmt.Errorf("size %q has unknown unit %q; %s", s, unit, suggestUnit(unit))
		}
		factor = f
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n > math.MaxInt64/factor {
		return Size{}, fmt.Errorf("size %q is too large", s)
	}
	if n == 0 {
		return Size{}, fmt.Errorf("size %q is zero; sizes must be greater than zero (or \"auto\")", s)
	}
	return Size{Bytes: n * factor}, nil
}

func suggestUnit(unit string) string {
	for u := range sizeUnits {
		if strings.EqualFold(u, unit) {
			return fmt.Sprintf("did you mean %q? (units are case-sensitive)", u)
		}
	}
	return "use B, K, M, G, T or KiB, MiB, GiB, TiB (binary) or KB, MB, GB, TB (decimal)"
}

// String gives the size the way a recipe would write it: "auto", the largest
// binary or decimal unit that divides it exactly ("8GiB", "4GB"), else bytes
// ("1234B"). The zero Size (not set) is "".
func (s Size) String() string {
	switch {
	case s.Auto:
		return "auto"
	case s.Bytes == 0:
		return ""
	}
	for _, u := range []string{"TiB", "TB", "GiB", "GB", "MiB", "MB", "KiB", "KB"} {
		if f := sizeUnits[u]; s.Bytes%f == 0 {
			return strconv.FormatInt(s.Bytes/f, 10) + u
		}
	}
	return strconv.FormatInt(s.Bytes, 10) + "B"
}

// UnmarshalYAML accepts a scalar: a string as ParseSize reads it, or a plain
// integer number of bytes.
func (s *Size) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf(`expected a size such as "8GiB" or "auto", got %s`, describe(n))
	}
	v, err := ParseSize(n.Value)
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// MarshalYAML writes String(); a zero Size is written as null.
func (s Size) MarshalYAML() (any, error) {
	if !s.Auto && s.Bytes == 0 {
		return nil, nil
	}
	return s.String(), nil
}
