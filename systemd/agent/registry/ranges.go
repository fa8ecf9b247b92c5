package registry

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// maxRanges bounds the byte ranges of one request. Pull clients ask for one
// (resuming a layer); thousands of tiny ranges only make the reply (one
// multipart header each) many times larger than the request.
const maxRanges = 16

// checkRange validates the Range header of a request for size bytes before
// http.ServeContent sees it, which answers "bytes=-0" with a 206 and an
// impossible Content-Range and takes any number of ranges. It returns the
// header to hand on, with the unsatisfiable ranges left out (as RFC 9110
// §14.1.1 allows), or a 416 RANGE_INVALID error for a malformed header, too
// many ranges, or no satisfiable range.
func checkRange(h string, size int64) (string, *apiError) {
	if h == "" {
		return "", nil
	}
	invalid := func(why string) (string, *apiError) {
		return "", newError(http.StatusRequestedRangeNotSatisfiable, codeRangeInvalid, fmt.Sprintf("Range %.100q: %s", h, why))
	}
	specs, ok := strings.CutPrefix(h, "bytes=")
	if !ok {
		return invalid("only bytes ranges are served")
	}
	var kept []string
	n := 0
	for spec := range strings.SplitSeq(specs, ",") {
		spec = strings.Trim(spec, " \t")
		if spec == "" {
			continue
		}
		if n++; n > maxRanges {
			return invalid(fmt.Sprintf("more than %d ranges", maxRanges))
		}
		first, last, ok := strings.Cut(spec, "-")
		if !ok {
			return invalid("want first-last, first- or -suffix")
		}
		switch {
		case first == "": // -suffix: the last suffix bytes; -0 is none of them
			sfx, ok := parsePos(last)
			if !ok {
				return invalid("bad suffix length")
			}
			if sfx == 0 || size == 0 {
				continue
			}
		default:
			from, ok := parsePos(first)
			if !ok {
				return invalid("bad first byte position")
			}
			if last != "" {
				to, ok := parsePos(last)
				if !ok || to < from {
					return invalid("bad last byte position")
				}
			}
			if from >= size {
				continue
			}
		}
		kept = append(kept, spec)
	}
	if len(kept) == 0 {
		return invalid("no range is inside the " + strconv.FormatInt(size, 10) + " bytes")
	}
	return "bytes=" + strings.Join(kept, ","), nil
}

// parsePos parses a byte position: digits only (no sign, no spaces).
func parsePos(s string) (int64, bool) {
	if s == "" || strings.Trim(s, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}
