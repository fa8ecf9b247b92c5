// Package human prints quantities for people: the same spelling in the
// factory's progress and messages and in the node's.
package human

import "fmt"

// Bytes prints a byte count in binary units, one decimal: 1.5 GiB, 320.0
// MiB, 12.0 KiB, 512 B.
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
