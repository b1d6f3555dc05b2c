package main

import (
	"archive/tar"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// TestImageTarball builds an image from a file and reads the tarball back as an
// OCI layout: named for containerd's import, valid digests, OCI media types,
// the entrypoint and non-root user set, the binary at its path.
func TestImageTarball(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "prog")
	if err := os.WriteFile(bin, []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "img.tar")
	if err := run(bin, "/prog", "mizar.dev/test:dev", out, "", "65532:65532"); err != nil {
		t.Fatal(err)
	}
	// Untar and open as a layout.
	lay := filepath.Join(dir, "layout")
	untar(t, out, lay)
	p, err := layout.FromPath(lay)
	if err != nil {
		t.Fatalf("not an OCI layout: %v", err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("index has %d manifests, want 1", len(im.Manifests))
	}
	d := im.Manifests[0]
	if d.MediaType != types.OCIManifestSchema1 || d.Annotations["io.containerd.image.name"] != "mizar.dev/test:dev" {
		t.Errorf("index entry: media type %s, annotations %v", d.MediaType, d.Annotations)
	}
	img, err := idx.Image(d.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Image(img); err != nil {
		t.Errorf("image does not validate: %v", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Config.Entrypoint) != 1 || cfg.Config.Entrypoint[0] != "/prog" || cfg.Config.User != "65532:65532" || cfg.OS != "linux" {
		t.Errorf("config: entrypoint %v user %q os %q", cfg.Config.Entrypoint, cfg.Config.User, cfg.OS)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	hdr, err := tar.NewReader(rc).Next()
	if err != nil || hdr.Name != "prog" || hdr.Mode != 0o755 {
		t.Errorf("layer entry: %+v, %v", hdr, err)
	}

	if err := run(filepath.Join(dir, "missing"), "/x", "a:b", out, "", "0:0"); err == nil {
		t.Error("a missing binary gave no error")
	}
	if err := run(bin, "/x", "a:b", out, "nodst", "0:0"); err == nil {
		t.Error("--extra without = gave no error")
	}
}

func untar(t *testing.T, file, dst string) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dst, hdr.Name)
		if hdr.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestImageOnBase puts the binary on a root filesystem tarball: the base is the
// first layer, byte for byte, the binary the second, and --user/--env reach
// the config; a bad --env or a missing base is refused.
func TestImageOnBase(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "prog")
	if err := os.WriteFile(bin, []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	baseTar := filepath.Join(dir, "rootfs.tar")
	f, err := os.Create(baseTar)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	body := []byte("hello\n")
	for _, h := range []*tar.Header{
		{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "etc/hello", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))},
		{Name: "bin/sh", Typeflag: tar.TypeSymlink, Linkname: "/bin/busybox", Mode: 0o777},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()

	out := filepath.Join(dir, "img.tar")
	s := spec{binary: bin, path: "/usr/local/bin/prog", name: "mizar.dev/base:dev", out: out, base: baseTar,
		user: "0:0", env: []string{"PATH=/usr/local/bin:/usr/bin:/bin"}}
	if err := build(s); err != nil {
		t.Fatal(err)
	}
	lay := filepath.Join(dir, "layout")
	untar(t, out, lay)
	p, err := layout.FromPath(lay)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("index: %v, %v", im, err)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Image(img); err != nil {
		t.Errorf("image does not validate: %v", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Config.User != "0:0" || len(cfg.Config.Env) != 1 || cfg.Config.Env[0] != "PATH=/usr/local/bin:/usr/bin:/bin" ||
		cfg.Config.Entrypoint[0] != "/usr/local/bin/prog" {
		t.Errorf("config: user %q env %v entrypoint %v", cfg.Config.User, cfg.Config.Env, cfg.Config.Entrypoint)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 2 {
		t.Fatalf("layers: %d, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got := map[string]*tar.Header{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = h
	}
	if h := got["bin/sh"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "/bin/busybox" {
		t.Errorf("base layer lost the symlink: %+v", h)
	}
	if h := got["etc/hello"]; h == nil || h.Size != int64(len(body)) {
		t.Errorf("base layer lost etc/hello: %+v", h)
	}

	bad := s
	bad.env = []string{"NOEQUALS"}
	if err := build(bad); err == nil {
		t.Error("--env without = gave no error")
	}
	bad = s
	bad.base = filepath.Join(dir, "missing.tar")
	if err := build(bad); err == nil {
		t.Error("a missing --base gave no error")
	}
}

// TestImageBaseOnlyWithCmd builds an image of a root filesystem alone, with
// ENTRYPOINT and CMD set (what the e2e test images need: jessie-dnsutils has
// no binary of its own, agnhost keeps CMD ["pause"]); one layer, the base. A
// binary without a path, or neither binary nor base, is refused.
func TestImageBaseOnlyWithCmd(t *testing.T) {
	dir := t.TempDir()
	baseTar := filepath.Join(dir, "rootfs.tar")
	f, err := os.Create(baseTar)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	if err := tw.WriteHeader(&tar.Header{Name: "bin/sh", Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777}); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	out := filepath.Join(dir, "img.tar")
	s := spec{name: "mizar.dev/baseonly:dev", out: out, base: baseTar, user: "0:0",
		entrypoint: []string{"/bin/sh", "-c"}, cmd: []string{"sleep 1", "x"}}
	if err := build(s); err != nil {
		t.Fatal(err)
	}
	lay := filepath.Join(dir, "layout")
	untar(t, out, lay)
	p, err := layout.FromPath(lay)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("index: %v, %v", im, err)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Image(img); err != nil {
		t.Errorf("image does not validate: %v", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Config.Entrypoint; len(got) != 2 || got[0] != "/bin/sh" || got[1] != "-c" {
		t.Errorf("entrypoint %q, want [/bin/sh -c]", got)
	}
	if got := cfg.Config.Cmd; len(got) != 2 || got[0] != "sleep 1" || got[1] != "x" {
		t.Errorf("cmd %q, want [sleep 1, x]", got)
	}
	if layers, err := img.Layers(); err != nil || len(layers) != 1 {
		t.Errorf("layers: %d, %v; want the base alone", len(layers), err)
	}

	bad := s
	bad.binary = baseTar
	if err := build(bad); err == nil {
		t.Error("--binary without --path gave no error")
	}
	bad = s
	bad.base = ""
	if err := build(bad); err == nil {
		t.Error("no --binary and no --base gave no error")
	}
}
