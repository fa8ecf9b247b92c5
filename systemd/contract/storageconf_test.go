package contract

import "testing"

func TestStorageConfigDefault(t *testing.T) {
	t.Parallel()
	got := string(StorageConfig{AdditionalImageStores: []string{StorePath}}.Render())
	want := `# Written by kiln. A whole storage.conf: containers/storage reads one file
# and merges nothing, so this replaces /usr/share/containers/storage.conf.
# additionalimagestores: kiln's preloaded images, read-only, from the image partition.
[storage]
  driver = "overlay"
  runroot = "/run/containers/storage"
  graphroot = "/var/lib/containers/storage"
  [storage.options]
    additionalimagestores = ["/var/lib/kiln/images/storage"]
    [storage.options.overlay]
      mountopt = "nodev"
`
	if got != want {
		t.Errorf("StorageConf:\n%s\nwant:\n%s", got, want)
	}
}
