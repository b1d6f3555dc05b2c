module mizar.dev

go 1.25.0
