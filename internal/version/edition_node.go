//go:build nodeonly

package version

const edition = Node
