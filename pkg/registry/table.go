package registry

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metatable "k8s.io/apimachinery/pkg/api/meta/table"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// tableConvertor renders a Kind's columns for kubectl get.
type tableConvertor[T runtime.Object, S, St any] struct {
	kind *Kind[T, S, St]
}

func (c tableConvertor[T, S, St]) ConvertToTable(_ context.Context, obj runtime.Object, tableOptions runtime.Object) (*metav1.Table, error) {
	table := &metav1.Table{}
	cols := c.kind.orderedColumns()
	opts, _ := tableOptions.(*metav1.TableOptions)
	if opts == nil || !opts.NoHeaders {
		table.ColumnDefinitions = c.columns(cols)
	}
	if m, err := meta.ListAccessor(obj); err == nil {
		table.ResourceVersion = m.GetResourceVersion()
		table.Continue = m.GetContinue()
		table.RemainingItemCount = m.GetRemainingItemCount()
	} else if m, err := meta.CommonAccessor(obj); err == nil {
		table.ResourceVersion = m.GetResourceVersion()
	}
	rows, err := metatable.MetaToTableRow(obj, func(o runtime.Object, _ metav1.Object, name, age string) ([]interface{}, error) {
		t, ok := o.(T)
		if !ok {
			return nil, fmt.Errorf("cannot show %T as a %s", o, c.kind.Singular)
		}
		cells := make([]interface{}, 0, len(c.kind.Columns)+2)
		cells = append(cells, name)
		for _, col := range cols {
			if col == nil {
				cells = append(cells, age)
				continue
			}
			cells = append(cells, col.Value(t))
		}
		return cells, nil
	})
	if err != nil {
		return nil, err
	}
	table.Rows = rows
	return table, nil
}

func (c tableConvertor[T, S, St]) columns(cols []*Column[T]) []metav1.TableColumnDefinition {
	defs := []metav1.TableColumnDefinition{{
		Name: "Name", Type: "string", Format: "name",
		Description: metav1.ObjectMeta{}.SwaggerDoc()["name"],
	}}
	for _, col := range cols {
		if col == nil {
			defs = append(defs, metav1.TableColumnDefinition{
				Name: "Age", Type: "date", Description: metav1.ObjectMeta{}.SwaggerDoc()["creationTimestamp"],
			})
			continue
		}
		defs = append(defs, metav1.TableColumnDefinition{
			Name: col.Name, Type: col.Type, Description: col.Description, Priority: col.Priority,
		})
	}
	return defs
}

// orderedColumns lays columns out as kubectl's own kinds do: the always-shown
// columns, then AGE (the nil entry), then the -o wide ones.
func (k *Kind[T, S, St]) orderedColumns() []*Column[T] {
	cols := make([]*Column[T], 0, len(k.Columns)+1)
	for i := range k.Columns {
		if k.Columns[i].Priority == 0 {
			cols = append(cols, &k.Columns[i])
		}
	}
	cols = append(cols, nil)
	for i := range k.Columns {
		if k.Columns[i].Priority != 0 {
			cols = append(cols, &k.Columns[i])
		}
	}
	return cols
}
