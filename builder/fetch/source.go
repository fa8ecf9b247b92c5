package fetch

import (
	"path/filepath"

	"github.com/kiln-appliance/kiln/recipes"
)

// Transports a recipe's image source may use.
const (
	TransportDocker        = recipes.TransportDocker
	TransportOCI           = recipes.TransportOCI
	TransportDockerArchive = recipes.TransportDockerArchive
)

// source is a recipe source (recipes.ParseSource: the one parser of the
// transport syntax) with its path made absolute.
type source struct {
	recipes.Source
	raw string
}

func (s source) String() string { return s.raw }

// parseSource parses s with the recipe's parser and joins a relative path to
// baseDir.
func parseSource(s, baseDir string) (source, error) {
	p, err := recipes.ParseSource(s)
	if err != nil {
		return source{raw: s}, err
	}
	if p.Path != "" && !filepath.IsAbs(p.Path) && baseDir != "" {
		p.Path = filepath.Join(baseDir, p.Path)
	}
	return source{Source: p, raw: s}, nil
}
