package contract

import "errors"

// ErrDamaged marks bytes that are not what their digest or checksum says: a
// slot's chunk or a boot file from a stick (the import refuses the bundle),
// an agent in the release store, a registry index. Each error wraps it with
// what was damaged. bundlefmt.ErrDamaged (the bundle's own bytes) is its own
// sentinel: the import answers it differently.
var ErrDamaged = errors.New("damaged")
