// Command image writes an OCI image layout, tarred, holding one static binary
// on an empty base (or on a root filesystem given as a tarball, --base): what
// `kind load image-archive` and `ctr images import` take.
//
//	image --binary _output/bin/mizar-apiserver --path /mizar-apiserver \
//	      --name mizar.dev/mizar-apiserver:dev --out _output/images/mizar-apiserver.tar
//
// --user and --env set the image's user (default 65532:65532, non-root) and
// environment: the kind node's control-plane images run as root, as kubeadm's
// static pods expect, and find their command on PATH. --entrypoint and --cmd
// set the image's ENTRYPOINT and CMD (comma-separated): the Kubernetes e2e test
// images (hack/kind/e2e-images.sh) keep their upstream defaults, e.g. agnhost's
// CMD ["pause"], and an image of a root filesystem alone (--base, no --binary)
// may name a command of that filesystem.
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
	base := flag.String("base", "", "tarball of a root filesystem to put under the binary (first layer)")
	user := flag.String("user", "65532:65532", "the image's user (uid:gid); 0:0 for a node agent that loads BPF programs")
	env := flag.String("env", "", "comma-separated KEY=VALUE environment of the image, e.g. PATH=/usr/local/bin:/usr/bin")
	entrypoint := flag.String("entrypoint", "", "comma-separated ENTRYPOINT (default: --path)")
	cmd := flag.String("cmd", "", "comma-separated CMD, the entrypoint's default arguments")
	flag.Parse()
	if *name == "" || *out == "" || (*base == "" && (*binary == "" || *path == "")) {
		fmt.Fprintln(os.Stderr, "image: --name, --out and either --binary with --path or --base are required")
		os.Exit(2)
	}
	s := spec{binary: *binary, path: *path, name: *name, out: *out, extra: *extra, base: *base, user: *user}
	if *env != "" {
		s.env = strings.Split(*env, ",")
	}
	if *entrypoint != "" {
		s.entrypoint = strings.Split(*entrypoint, ",")
	}
	if *cmd != "" {
		s.cmd = strings.Split(*cmd, ",")
	}
	if err := build(s); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

// spec is one image: the binary at path (the entrypoint unless entrypoint is
// set), extra files, an optional base root filesystem, the user, environment
// and default arguments. With a base, the binary may be left out.
type spec struct {
	binary, path, name, out, extra, base, user string
	env, entrypoint, cmd                       []string
}

// run builds an image of the binary alone, as user.
func run(binary, path, name, out, extra, user string) error {
	return build(spec{binary: binary, path: path, name: name, out: out, extra: extra, user: user})
}

func build(s spec) error {
	binary, path, name, out, extra := s.binary, s.path, s.name, s.out, s.extra
	for _, kv := range s.env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return fmt.Errorf("--env %q: want KEY=VALUE", kv)
		}
	}
	if (binary == "") != (path == "") {
		return fmt.Errorf("--binary %q and --path %q: give both or neither", binary, path)
	}
	if binary == "" && s.base == "" {
		return fmt.Errorf("no --binary and no --base: the image would be empty")
	}
	files := map[string]string{}
	if binary != "" {
		files[path] = binary
	}
	if extra != "" {
		for _, kv := range strings.Split(extra, ",") {
			src, dst, ok := strings.Cut(kv, "=")
			if !ok {
				return fmt.Errorf("--extra %q: want src=dst", kv)
			}
			files[dst] = src
		}
	}
	var layers []v1.Layer
	if len(files) > 0 {
		layer, err := layerOf(files)
		if err != nil {
			return err
		}
		layers = append(layers, layer)
	}
	if s.base != "" {
		if _, err := os.Stat(s.base); err != nil {
			return fmt.Errorf("--base: %w", err)
		}
		// Compressed as the image is written; the tarball holds the rootfs as is.
		rootfs, err := tarball.LayerFromFile(s.base, tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return fmt.Errorf("reading the base %s: %w", s.base, err)
		}
		layers = append([]v1.Layer{rootfs}, layers...)
	}
	// OCI media types throughout (empty.Image starts with Docker's).
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layers...)
	if err != nil {
		return fmt.Errorf("adding the layer: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("reading the image config: %w", err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", "amd64"
	// Non-root by default (--user), as the chart's securityContext expects.
	cfg.Config.User = s.user
	cfg.Config.Env = s.env
	cfg.Config.Entrypoint = s.entrypoint
	if cfg.Config.Entrypoint == nil && path != "" {
		cfg.Config.Entrypoint = []string{path}
	}
	cfg.Config.Cmd = s.cmd
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
