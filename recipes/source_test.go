package recipes

import "testing"

func TestParseSource(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want Source
	}{
		{"docker://quay.io/acme/app:1.2", Source{Transport: "docker", Ref: "quay.io/acme/app:1.2"}},
		{"docker://registry.local:5000/acme/app@sha256:1111111111111111111111111111111111111111111111111111111111111111",
			Source{Transport: "docker", Ref: "registry.local:5000/acme/app@sha256:1111111111111111111111111111111111111111111111111111111111111111"}},
		{"oci:layouts/app", Source{Transport: "oci", Path: "layouts/app"}},
		{"oci:/srv/layouts/app:1.2", Source{Transport: "oci", Path: "/srv/layouts/app", Tag: "1.2"}},
		{"oci:./app:quay.io/acme/app:1.2", Source{Transport: "oci", Path: "./app", Tag: "quay.io/acme/app:1.2"}},
		{"docker-archive:app.tar", Source{Transport: "docker-archive", Path: "app.tar"}},
		{"docker-archive:/srv/app.tar:acme/app:1.2", Source{Transport: "docker-archive", Path: "/srv/app.tar", Ref: "acme/app:1.2"}},
	} {
		got, err := ParseSource(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseSource(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
			continue
		}
		if s := got.String(); s != c.in {
			t.Errorf("String() = %q, want %q", s, c.in)
		}
	}
	for _, c := range []struct{ in, want string }{
		{"quay.io/acme/app:1.2", `source "quay.io/acme/app:1.2" has no transport; write docker://quay.io/acme/app:1.2 for a registry, oci:DIR[:TAG] for an OCI layout directory or docker-archive:FILE[:REF] for a docker save archive`},
		{"registry.local:5000/app:1", `source "registry.local:5000/app:1" has no transport; write docker://registry.local:5000/app:1 for a registry, oci:DIR[:TAG] for an OCI layout directory or docker-archive:FILE[:REF] for a docker save archive`},
		{"layouts/app", `source "layouts/app" has no transport; write docker://layouts/app for a registry, oci:DIR[:TAG] for an OCI layout directory or docker-archive:FILE[:REF] for a docker save archive`},
		{"docker:quay.io/acme/app:1", `source "docker:quay.io/acme/app:1": a registry source is written docker://REGISTRY/REPOSITORY:TAG`},
		{"docker://", `source "docker://": a registry source is written docker://REGISTRY/REPOSITORY:TAG`},
		{"docker://nginx", `source "docker://nginx": "nginx" has no tag or digest (kiln never assumes :latest); write it in full, e.g. docker.io/library/nginx:TAG`},
		{"docker://Quay.io/App:1", "source \"docker://Quay.io/App:1\": \"Quay.io/App:1\" is not a valid image reference: repository can only contain the characters `abcdefghijklmnopqrstuvwxyz0123456789_-./`: App"},
		{"oci:", `source "oci:": an OCI layout source is written oci:DIR or oci:DIR:TAG`},
		{"oci:dir:bad tag", `source "oci:dir:bad tag": "bad tag" is not a valid OCI reference name`},
		{"docker-archive:", `source "docker-archive:": a docker archive source is written docker-archive:FILE or docker-archive:FILE:REF`},
		{"docker-archive:a.tar:acme/app@sha256:1111111111111111111111111111111111111111111111111111111111111111", `source "docker-archive:a.tar:acme/app@sha256:1111111111111111111111111111111111111111111111111111111111111111": "acme/app@sha256:1111111111111111111111111111111111111111111111111111111111111111" is not a tag reference like acme/app:1.2 (as in the archive's RepoTags)`},
		{"https://quay.io/acme/app", `source "https://quay.io/acme/app": kiln does not download from URLs; use docker://REGISTRY/REPOSITORY:TAG for a registry`},
		{"containers-storage:quay.io/acme/app:1", `source "containers-storage:quay.io/acme/app:1" has unknown transport "containers-storage:"; kiln reads docker://, oci: and docker-archive:`},
	} {
		if _, err := ParseSource(c.in); err == nil || err.Error() != c.want {
			t.Errorf("ParseSource(%q):\ngot  %v\nwant %s", c.in, err, c.want)
		}
	}
}
