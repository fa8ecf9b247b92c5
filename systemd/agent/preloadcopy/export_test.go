package preloadcopy

// WithRunRoot sets the main store's run root (default
// contract.DefaultRunRoot): the tests' stores are their own.
func WithRunRoot(dir string) CopyOption { return func(o *copyOptions) { o.runRoot = dir } }
