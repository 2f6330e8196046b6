package sqlitestore

import "context"

// OpenHooked is Open with a test seam: created runs once Open has created
// or found the file at path, before SQLite opens it.
func OpenHooked(ctx context.Context, path string, opts *Options, created func(path string)) (*Store, error) {
	return open(ctx, path, opts, created, nil)
}

// OpenHookedWAL is Open with a test seam: beforeWAL runs once Open has
// checked the schema, before it turns the file to WAL.
func OpenHookedWAL(ctx context.Context, path string, opts *Options, beforeWAL func()) (*Store, error) {
	return open(ctx, path, opts, nil, beforeWAL)
}
