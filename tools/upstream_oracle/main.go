// Command upstream-oracle prints what Kubeflow Trainer v2.3.0 itself builds for one TrainJob and its runtime.
//
// It links Trainer's own packages (the runtime registry, the framework and every plugin) and runs them
// against a controller-runtime fake client that holds the objects read from stdin, so the golden fixtures
// under tests/golden are produced by the upstream code rather than by a second reading of it.
//
// Input (stdin): a YAML or JSON stream with exactly one TrainJob, its runtime (TrainingRuntime or
// ClusterTrainingRuntime) and optionally objects that already exist (a JobSet, a PodGroup, a Secret, ...).
//
// Output (stdout), by mode:
//
//	(default)      a JSON array: every apply configuration the runtime's NewObjects returns, each marshalled
//	               with encoding/json, with an extra "_kind" key in front.
//	--validate     a JSON object {"warnings": [...], "errors": [...]} from ValidateObjects(ctx, nil, trainJob).
//	--status       a JSON object: the TrainJobStatus the runtime computes from the objects in the fake client.
//	--emit-stored  a JSON array of the input objects as the API server would store them (after --crds pruning
//	               and defaulting, before any typed round trip).
//
// Errors go to stderr and the exit code is 1 (2 for bad usage).
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"unsafe"

	"github.com/go-logr/logr"
	apiextensionsinternal "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	structuralpruning "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	apiruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	jobsetv1alpha2 "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	schedulerpluginsv1alpha1 "sigs.k8s.io/scheduler-plugins/apis/scheduling/v1alpha1"
	"sigs.k8s.io/yaml"
	volcanov1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	configapi "github.com/kubeflow/trainer/v2/pkg/apis/config/v1alpha1"
	trainer "github.com/kubeflow/trainer/v2/pkg/apis/trainer/v1alpha1"
	"github.com/kubeflow/trainer/v2/pkg/config"
	jobruntime "github.com/kubeflow/trainer/v2/pkg/runtime"
	runtimecore "github.com/kubeflow/trainer/v2/pkg/runtime/core"
	"github.com/kubeflow/trainer/v2/pkg/runtime/framework"
	"github.com/kubeflow/trainer/v2/pkg/runtime/framework/plugins/coscheduling"
	"github.com/kubeflow/trainer/v2/pkg/runtime/framework/plugins/flux"
	"github.com/kubeflow/trainer/v2/pkg/runtime/framework/plugins/jax"
	"github.com/kubeflow/trainer/v2/pkg/runtime/framework/plugins/jobset"
	"github.com/kubeflow/trainer/v2/pkg/runtime/framework/plugins/mpi"
	"github.com/kubeflow/trainer/v2/pkg/runtime/framework/plugins/plainml"
	"github.com/kubeflow/trainer/v2/pkg/runtime/framework/plugins/torch"
	"github.com/kubeflow/trainer/v2/pkg/runtime/framework/plugins/trainjobstatus"
	"github.com/kubeflow/trainer/v2/pkg/runtime/framework/plugins/volcano"
	"github.com/kubeflow/trainer/v2/pkg/runtime/framework/plugins/xgboost"
)

// scheme is the controller manager's scheme (cmd/trainer-controller-manager/main.go).
var scheme = apiruntime.NewScheme()

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(configapi.AddToScheme(scheme))
	utilruntime.Must(trainer.AddToScheme(scheme))
	utilruntime.Must(jobsetv1alpha2.AddToScheme(scheme))
	utilruntime.Must(schedulerpluginsv1alpha1.AddToScheme(scheme))
	utilruntime.Must(volcanov1beta1.AddToScheme(scheme))
}

// registryOrder is the order in which plugins/registry.go lists the plugins. Trainer collects plugins by
// ranging over that map, so the order inside a phase is random per process; the oracle fixes it (see
// --plugin-order) so that its output is reproducible.
var registryOrder = []string{
	coscheduling.Name, flux.Name, volcano.Name, mpi.Name, plainml.Name,
	torch.Name, jobset.Name, jax.Name, xgboost.Name, trainjobstatus.Name,
}

type stringList []string

func (s *stringList) String() string { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error {
	for _, part := range strings.Split(v, ",") {
		if part = strings.TrimSpace(part); part != "" {
			*s = append(*s, part)
		}
	}
	return nil
}

type options struct {
	validate     bool
	status       bool
	emitStored   bool
	crds         stringList
	pluginOrder  string
	featureGates string
	configFile   string
	verbose      bool
}

func main() {
	var opts options
	fs := flag.NewFlagSet("upstream-oracle", flag.ContinueOnError)
	fs.BoolVar(&opts.validate, "validate", false, "run ValidateObjects(ctx, nil, trainJob) and print the field errors")
	fs.BoolVar(&opts.status, "status", false, "print the runtime's TrainJobStatus instead of the built objects")
	fs.BoolVar(&opts.emitStored, "emit-stored", false, "print the input objects as stored (after --crds defaulting) and exit")
	fs.Var(&opts.crds, "crds", "CRD YAML files or directories (comma-separated, repeatable); input objects of those kinds are "+
		"pruned and defaulted with the CRD's structural schema, as the API server does on create")
	fs.StringVar(&opts.pluginOrder, "plugin-order", "registry",
		"order of plugins inside each phase: registry (plugins/registry.go listing order), reverse, or native (Go map order, random)")
	fs.StringVar(&opts.featureGates, "feature-gates", "", "Trainer feature gates, e.g. TrainJobStatus=true")
	fs.StringVar(&opts.configFile, "config", "", "Trainer Configuration file (default: the built-in defaults)")
	fs.BoolVar(&opts.verbose, "v", false, "log Trainer's messages to stderr")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	modes := 0
	for _, m := range []bool{opts.validate, opts.status, opts.emitStored} {
		if m {
			modes++
		}
	}
	if modes > 1 || fs.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "upstream-oracle: use at most one of --validate, --status, --emit-stored, and no arguments")
		os.Exit(2)
	}
	if err := run(context.Background(), opts, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "upstream-oracle:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, opts options, in io.Reader, out io.Writer) error {
	if opts.verbose {
		ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(true)))
	} else {
		ctrl.SetLogger(logr.Discard())
	}
	ctx = ctrl.LoggerInto(ctx, ctrl.Log)

	// Configuration and feature gates, as cmd/trainer-controller-manager/main.go loads them.
	_, cfg, err := config.Load(scheme, opts.configFile)
	if err != nil {
		return fmt.Errorf("loading configuration: %w", err)
	}
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(cfg.FeatureGates); err != nil {
		return fmt.Errorf("feature gates from configuration: %w", err)
	}
	if opts.featureGates != "" {
		if err := utilfeature.DefaultMutableFeatureGate.Set(opts.featureGates); err != nil {
			return fmt.Errorf("--feature-gates: %w", err)
		}
	}

	defaulter, err := loadCRDs(opts.crds)
	if err != nil {
		return err
	}
	objs, stored, err := readObjects(in, defaulter)
	if err != nil {
		return err
	}
	if opts.emitStored {
		return writeJSON(out, stored)
	}

	var trainJob *trainer.TrainJob
	for _, o := range objs {
		if tj, ok := o.(*trainer.TrainJob); ok {
			if trainJob != nil {
				return errors.New("input has more than one TrainJob")
			}
			trainJob = tj
		}
	}
	if trainJob == nil {
		return errors.New("input has no TrainJob")
	}

	runtimes, cl, err := newRuntimes(ctx, objs, &cfg)
	if err != nil {
		return err
	}
	if err := orderPlugins(runtimes, opts.pluginOrder); err != nil {
		return err
	}

	// The controller reads the TrainJob back from its cache; read it back from the fake client likewise.
	var tj trainer.TrainJob
	if err := cl.Get(ctx, client.ObjectKeyFromObject(trainJob), &tj); err != nil {
		return fmt.Errorf("reading the TrainJob back: %w", err)
	}

	// Runtime lookup exactly as pkg/controller/trainjob_controller.go and pkg/webhooks do it.
	gk := jobruntime.RuntimeRefToRuntimeRegistryKey(tj.Spec.RuntimeRef)
	rt, ok := runtimes[gk]
	if !ok {
		return fmt.Errorf("unsupported runtime: %s", gk)
	}

	switch {
	case opts.validate:
		var warnings []string
		var errs field.ErrorList
		if err := recovering("ValidateObjects", func() { warnings, errs = rt.ValidateObjects(ctx, nil, &tj) }); err != nil {
			return err
		}
		return writeJSON(out, validationResult(warnings, errs))
	case opts.status:
		var status *trainer.TrainJobStatus
		if err := recovering("TrainJobStatus", func() { status, err = rt.TrainJobStatus(ctx, &tj) }); err != nil {
			return err
		}
		if err != nil {
			return fmt.Errorf("TrainJobStatus: %w", err)
		}
		return writeJSON(out, status)
	default:
		var applyConfigs []apiruntime.ApplyConfiguration
		if err := recovering("NewObjects", func() { applyConfigs, err = rt.NewObjects(ctx, &tj) }); err != nil {
			return err
		}
		if err != nil {
			return fmt.Errorf("NewObjects: %w", err)
		}
		return writeApplyConfigurations(out, applyConfigs)
	}
}

// recovering runs fn and turns a panic inside Trainer's code into an error that names the innermost
// Trainer function on the stack, e.g. "NewObjects panicked in flux.(*Flux).EnforceMLPolicy: runtime
// error: invalid memory address or nil pointer dereference".
func recovering(what string, fn func()) (err error) {
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		where := ""
		for _, line := range strings.Split(string(debug.Stack()), "\n") {
			const marker = "github.com/kubeflow/trainer/v2/pkg/"
			if i := strings.Index(line, marker); i >= 0 && !strings.HasPrefix(strings.TrimSpace(line), "/") {
				fn := line[i+len(marker):]
				if j := strings.LastIndex(fn, "("); j > 0 && strings.HasSuffix(fn, ")") {
					fn = fn[:j]
				}
				if k := strings.LastIndex(fn, "/"); k >= 0 {
					fn = fn[k+1:]
				}
				where = " in " + fn
				break
			}
		}
		err = fmt.Errorf("%s panicked%s: %v", what, where, r)
	}()
	fn()
	return nil
}

// newRuntimes builds the fake client and Trainer's runtimes the way the controller manager does at
// startup (runtimecore.New with the client, the field indexer and the Configuration).
//
// The fake client takes its field indexes at build time, while runtimecore.New registers them on the
// indexer it is given; so the indexes are first recorded against a throwaway client, then the real client
// is built with them and the runtimes are made again against it.
func newRuntimes(ctx context.Context, objs []client.Object, cfg *configapi.Configuration) (map[string]jobruntime.Runtime, client.Client, error) {
	rec := &recordingIndexer{}
	if _, err := runtimecore.New(ctx, fake.NewClientBuilder().WithScheme(scheme).Build(), rec, cfg); err != nil {
		return nil, nil, fmt.Errorf("initializing runtimes: %w", err)
	}
	builder := fake.NewClientBuilder().
		WithScheme(scheme).
		WithObjects(objs...).
		WithStatusSubresource(&trainer.TrainJob{}, &jobsetv1alpha2.JobSet{},
			&schedulerpluginsv1alpha1.PodGroup{}, &volcanov1beta1.PodGroup{})
	for _, idx := range rec.indexes {
		builder = builder.WithIndex(idx.obj, idx.field, idx.fn)
	}
	cl := builder.Build()
	runtimes, err := runtimecore.New(ctx, cl, noopIndexer{}, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("initializing runtimes: %w", err)
	}
	return runtimes, cl, nil
}

type recordedIndex struct {
	obj   client.Object
	field string
	fn    client.IndexerFunc
}

type recordingIndexer struct{ indexes []recordedIndex }

func (r *recordingIndexer) IndexField(_ context.Context, obj client.Object, field string, fn client.IndexerFunc) error {
	r.indexes = append(r.indexes, recordedIndex{obj: obj, field: field, fn: fn})
	return nil
}

type noopIndexer struct{}

func (noopIndexer) IndexField(context.Context, client.Object, string, client.IndexerFunc) error {
	return nil
}

// orderPlugins sorts the plugin lists of the framework shared by both runtime kinds. The lists are
// unexported fields of fwkcore.Framework, so they are reached with reflect; nothing else is changed.
func orderPlugins(runtimes map[string]jobruntime.Runtime, order string) error {
	if order == "native" {
		return nil
	}
	rank := map[string]int{}
	for i, name := range registryOrder {
		rank[name] = i
		if order == "reverse" {
			rank[name] = len(registryOrder) - i
		}
	}
	if order != "registry" && order != "reverse" {
		return fmt.Errorf("--plugin-order: unknown order %q", order)
	}
	tr, ok := runtimes[runtimecore.TrainingRuntimeGroupKind].(*runtimecore.TrainingRuntime)
	if !ok {
		return fmt.Errorf("runtime %s has unexpected type %T", runtimecore.TrainingRuntimeGroupKind, runtimes[runtimecore.TrainingRuntimeGroupKind])
	}
	fwkField := reflect.ValueOf(tr).Elem().FieldByName("framework")
	if !fwkField.IsValid() || fwkField.Kind() != reflect.Pointer || fwkField.IsNil() {
		return errors.New("TrainingRuntime has no framework field; the oracle needs updating for this Trainer version")
	}
	fwk := fwkField.Elem()
	pluginType := reflect.TypeFor[framework.Plugin]()
	sorted := 0
	for i := 0; i < fwk.NumField(); i++ {
		f := fwk.Field(i)
		if f.Kind() != reflect.Slice || !f.Type().Elem().Implements(pluginType) {
			continue
		}
		f = reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem()
		names := make([]string, f.Len())
		for j := range names {
			names[j] = f.Index(j).Interface().(framework.Plugin).Name()
			if _, known := rank[names[j]]; !known {
				return fmt.Errorf("plugin %q is not in the oracle's registry order", names[j])
			}
		}
		swap := reflect.Swapper(f.Interface())
		sort.Sort(byRank{names: names, rank: rank, swap: swap})
		sorted++
	}
	if sorted == 0 {
		return errors.New("found no plugin lists in the framework; the oracle needs updating for this Trainer version")
	}
	return nil
}

type byRank struct {
	names []string
	rank  map[string]int
	swap  func(i, j int)
}

func (b byRank) Len() int           { return len(b.names) }
func (b byRank) Less(i, j int) bool { return b.rank[b.names[i]] < b.rank[b.names[j]] }
func (b byRank) Swap(i, j int) {
	b.names[i], b.names[j] = b.names[j], b.names[i]
	b.swap(i, j)
}

// crdDefaulter prunes and defaults custom resources with their CRD's structural schema, the way the API
// server does when it decodes a create request (pruning, dropping nulls, then defaulting).
type crdDefaulter map[schema.GroupVersionKind]*structuralschema.Structural

func loadCRDs(paths []string) (crdDefaulter, error) {
	d := crdDefaulter{}
	var files []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("--crds: %w", err)
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		for _, ext := range []string{"*.yaml", "*.yml", "*.json"} {
			matches, _ := filepath.Glob(filepath.Join(p, ext))
			files = append(files, matches...)
		}
	}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("--crds: %w", err)
		}
		docs, err := splitYAML(data)
		if err != nil {
			return nil, fmt.Errorf("--crds %s: %w", file, err)
		}
		for _, doc := range docs {
			var crd apiextensionsv1.CustomResourceDefinition
			if err := json.Unmarshal(doc, &crd); err != nil {
				return nil, fmt.Errorf("--crds %s: %w", file, err)
			}
			if crd.Kind != "CustomResourceDefinition" {
				continue
			}
			for _, v := range crd.Spec.Versions {
				if v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
					continue
				}
				internal := &apiextensionsinternal.CustomResourceValidation{}
				if err := apiextensionsv1.Convert_v1_CustomResourceValidation_To_apiextensions_CustomResourceValidation(v.Schema, internal, nil); err != nil {
					return nil, fmt.Errorf("--crds %s: converting %s schema: %w", file, v.Name, err)
				}
				s, err := structuralschema.NewStructural(internal.OpenAPIV3Schema)
				if err != nil {
					return nil, fmt.Errorf("--crds %s: %s is not structural: %w", file, v.Name, err)
				}
				s = s.DeepCopy()
				if err := structuraldefaulting.PruneDefaults(s); err != nil {
					return nil, fmt.Errorf("--crds %s: pruning defaults: %w", file, err)
				}
				gvk := schema.GroupVersionKind{Group: crd.Spec.Group, Version: v.Name, Kind: crd.Spec.Names.Kind}
				d[gvk] = s
			}
		}
	}
	return d, nil
}

func (d crdDefaulter) apply(u *unstructured.Unstructured) {
	s, ok := d[u.GroupVersionKind()]
	if !ok {
		return
	}
	structuralpruning.Prune(u.Object, s, true)
	structuraldefaulting.PruneNonNullableNullsWithoutDefaults(u.Object, s)
	structuraldefaulting.Default(u.Object, s)
}

func splitYAML(data []byte) ([][]byte, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		j, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil, err
		}
		if t := bytes.TrimSpace(j); len(t) == 0 || bytes.Equal(t, []byte("null")) {
			continue
		}
		docs = append(docs, j)
	}
}

// readObjects decodes every document into the typed object of its kind, and also returns the documents
// as stored (after --crds pruning and defaulting, before any typed round trip). Unknown fields are an
// error: the API server would prune them (use --crds), and silently dropping a misspelt field makes a
// wrong fixture.
func readObjects(in io.Reader, defaulter crdDefaulter) ([]client.Object, []map[string]any, error) {
	data, err := io.ReadAll(in)
	if err != nil {
		return nil, nil, err
	}
	docs, err := splitYAML(data)
	if err != nil {
		return nil, nil, fmt.Errorf("reading input: %w", err)
	}
	var objs []client.Object
	var stored []map[string]any
	for i, doc := range docs {
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(doc); err != nil {
			return nil, nil, fmt.Errorf("input document %d: %w", i, err)
		}
		defaulter.apply(u)
		stored = append(stored, u.DeepCopy().Object)
		gvk := u.GroupVersionKind()
		typed, err := scheme.New(gvk)
		if err != nil {
			return nil, nil, fmt.Errorf("input document %d (%s %q): %w", i, gvk.Kind, u.GetName(), err)
		}
		if err := apiruntime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, typed, true); err != nil {
			return nil, nil, fmt.Errorf("input document %d (%s %q): %w", i, gvk.Kind, u.GetName(), err)
		}
		obj, ok := typed.(client.Object)
		if !ok {
			return nil, nil, fmt.Errorf("input document %d: %s is not an object", i, gvk.Kind)
		}
		obj.GetObjectKind().SetGroupVersionKind(gvk)
		objs = append(objs, obj)
	}
	return objs, stored, nil
}

func writeApplyConfigurations(out io.Writer, acs []apiruntime.ApplyConfiguration) error {
	elems := make([]json.RawMessage, 0, len(acs))
	for _, ac := range acs {
		raw, err := json.Marshal(ac)
		if err != nil {
			return fmt.Errorf("marshalling %T: %w", ac, err)
		}
		var tm struct {
			Kind string `json:"kind"`
		}
		_ = json.Unmarshal(raw, &tm)
		hint := tm.Kind
		if hint == "" {
			hint = reflect.TypeOf(ac).String()
		}
		hintJSON, _ := json.Marshal(hint)
		// Put "_kind" first and keep the apply configuration's own field order after it.
		var elem []byte
		if trimmed := bytes.TrimSpace(raw); bytes.Equal(trimmed, []byte("{}")) {
			elem = []byte(`{"_kind":` + string(hintJSON) + `}`)
		} else {
			elem = append([]byte(`{"_kind":`+string(hintJSON)+`,`), trimmed[1:]...)
		}
		elems = append(elems, elem)
	}
	return writeJSON(out, elems)
}

type fieldError struct {
	Type     string `json:"type"`
	Field    string `json:"field"`
	BadValue any    `json:"badValue,omitempty"`
	Detail   string `json:"detail"`
	Error    string `json:"error"`
}

func validationResult(warnings []string, errs field.ErrorList) any {
	res := struct {
		Warnings []string     `json:"warnings"`
		Errors   []fieldError `json:"errors"`
	}{Warnings: slices.Clone(warnings), Errors: []fieldError{}}
	if res.Warnings == nil {
		res.Warnings = []string{}
	}
	for _, e := range errs {
		fe := fieldError{Type: string(e.Type), Field: e.Field, Detail: e.Detail, Error: e.Error()}
		if e.BadValue != nil {
			if _, err := json.Marshal(e.BadValue); err == nil {
				fe.BadValue = e.BadValue
			} else {
				fe.BadValue = fmt.Sprintf("%v", e.BadValue)
			}
		}
		res.Errors = append(res.Errors, fe)
	}
	return res
}

func writeJSON(out io.Writer, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return err
	}
	buf.WriteByte('\n')
	_, err = out.Write(buf.Bytes())
	return err
}
