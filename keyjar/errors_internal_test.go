package keyjar

import (
	"errors"
	"io/fs"
	"syscall"
	"testing"
)

// A read-only file system is a permission error, as Open documents; other
// errors are left as they are.
func TestPermission(t *testing.T) {
	rofs := permission(&fs.PathError{Op: "open", Path: "keys.db", Err: syscall.EROFS})
	if !errors.Is(rofs, fs.ErrPermission) || !errors.Is(rofs, syscall.EROFS) {
		t.Errorf("EROFS: %v; want fs.ErrPermission and EROFS", rofs)
	}
	acces := &fs.PathError{Op: "open", Path: "keys.db", Err: syscall.EACCES}
	if got := permission(acces); got != error(acces) {
		t.Errorf("EACCES: %v; want it unchanged", got)
	}
	noent := &fs.PathError{Op: "open", Path: "keys.db", Err: syscall.ENOENT}
	if got := permission(noent); errors.Is(got, fs.ErrPermission) {
		t.Errorf("ENOENT: %v; want no permission error", got)
	}
}
