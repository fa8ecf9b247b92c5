package reflash

// WithBootMounts sets the mount points whose disks are the running
// system's (default /, /boot, /sysroot, /usr).
func WithBootMounts(points ...string) Option { return func(r *reflasher) { r.bootMounts = points } }
