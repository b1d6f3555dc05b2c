// Command image writes an OCI image layout, tarred, holding one static binary
// on an empty base: what `kind load image-archive` and `ctr images import` take.
//
//	image --binary _output/bin/mizar-apiserver --path /mizar-apiserver \
//	      --name mizar.dev/mizar-apiserver:dev --out _output/images/mizar-apiserver.tar
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

func main() {
	binary := flag.String("binary", "", "static binary to put in the image")
	path := flag.String("path", "", "where the binary goes in the image (its entrypoint)")
	name := flag.String("name", "", "image reference, e.g. mizar.dev/mizar-apiserver:dev")
	out := flag.String("out", "", "output tarball")
	extra := flag.String("extra", "", "comma-separated extra files, src=dst, e.g. bin/mizar=/opt/mizar/bin/mizar")
	user := flag.String("user", "65532:65532", "the image's user (uid:gid); 0:0 for a node agent that loads BPF programs")
	flag.Parse()
	if *binary == "" || *path == "" || *name == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "image: --binary, --path, --name and --out are required")
		os.Exit(2)
	}
	if err := run(*binary, *path, *name, *out, *extra, *user); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(binary, path, name, out, extra, user string) error {
	files := map[string]string{path: binary}
	if extra != "" {
		for _, kv := range strings.Split(extra, ",") {
			src, dst, ok := strings.Cut(kv, "=")
			if !ok {
				return fmt.Errorf("--extra %q: want src=dst", kv)
			}
			files[dst] = src
		}
	}
	layer, err := layerOf(files)
	if err != nil {
		return err
	}
	// OCI media types throughout (empty.Image starts with Docker's).
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return fmt.Errorf("adding the layer: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("reading the image config: %w", err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", "amd64"
	// Non-root unless asked: the chart's apiserver securityContext expects 65532.
	cfg.Config.User = user
	cfg.Config.Entrypoint = []string{path}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return fmt.Errorf("setting the image config: %w", err)
	}

	dir, err := os.MkdirTemp("", "oci-layout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("writing the OCI layout: %w", err)
	}
	// containerd names the imported image after these annotations.
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"io.containerd.image.name":          name,
		"org.opencontainers.image.ref.name": name,
	})); err != nil {
		return fmt.Errorf("adding the image to the layout: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	return tarDir(dir, out)
}

// layerOf builds one uncompressed-then-gzipped layer holding files (image path -> host file).
func layerOf(files map[string]string) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for dst, src := range files {
		b, err := os.ReadFile(src)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", src, err)
		}
		// Fixed times keep the image digest reproducible.
		hdr := &tar.Header{Name: strings.TrimPrefix(dst, "/"), Mode: 0o755, Size: int64(len(b)), ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(b); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithMediaType(types.OCILayer))
}

func tarDir(dir, out string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		_, err = tw.Write(b)
		return err
	})
	if err != nil {
		return fmt.Errorf("writing %s: %w", out, err)
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}
