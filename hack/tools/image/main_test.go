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
