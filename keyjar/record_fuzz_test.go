package keyjar_test

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/secrethdr"
	"github.com/idemkit/idem/keyjar"
)

// FuzzRecord: a record of any bytes that Begin takes reads back from Get,
// ByKey and List exactly as Begin returned it, which is the record given
// with its times in UTC and without the headers SecretHeader names. Begin
// refuses, with ErrInvalid, only a record without Op or Key.
func FuzzRecord(f *testing.F) {
	f.Add("charge:o1", "9b2c…", "fp", "POST", "http://127.0.0.1/charge", "Content-Type", "application/json",
		[]byte(`{"amount":100}`), false, "note", "dial tcp: refused", "h1", int64(1740830400000000000), int64(-1), 3, 503)
	f.Add("caf\xe9\x00", "k\x00ey", "", "", "", "X-Caf\xe9", "\x00base64:QQ==", []byte{}, false, "\xff", "\x00", "", int64(1), int64(0), 0, 0)
	f.Add("op", "key", "", "PUT", "/", "Authorization", "Bearer sk_test", []byte(nil), true, "", "", "", int64(-1), int64(1<<62), -1, -1)
	f.Add("", "key", "", "", "", "", "", []byte(nil), false, "", "", "", int64(0), int64(0), 0, 0)

	j, err := keyjar.Open(context.Background(), filepath.Join(f.TempDir(), "keys.db"), nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { j.Close() })
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, op, key, fp, method, url, name, value string, body []byte, nilHeader bool,
		note, lastError, holder string, created, lease int64, attempts, status int) {
		r := idem.Record{Op: op, Key: key, Fingerprint: fp, State: idem.StatePending, Method: method, URL: url,
			Body: body, BodySize: int64(len(body)), Attempts: attempts, LastStatus: status, LastError: lastError,
			Note: note, Holder: holder}
		if !nilHeader {
			r.Header = http.Header{name: {value, ""}}
		}
		// Any time Unix nanoseconds hold; 0 stands for the zero time.
		for _, tm := range []struct {
			dst *time.Time
			n   int64
		}{{&r.Created, created}, {&r.Updated, created}, {&r.NextAttempt, -created}, {&r.LeaseUntil, lease}} {
			if tm.n != 0 {
				*tm.dst = time.Unix(0, tm.n).In(time.FixedZone("X", 3600))
			}
		}
		got, created2, err := j.Begin(ctx, r)
		if op == "" || key == "" {
			if !errors.Is(err, keyjar.ErrInvalid) {
				t.Fatalf("Begin of a record without Op or Key: %v; want ErrInvalid", err)
			}
			return
		}
		if err != nil || !created2 {
			t.Fatalf("Begin(%+v) = %v, %v", r, created2, err)
		}
		t.Cleanup(func() {
			if err := j.Forget(ctx, op); err != nil {
				t.Errorf("Forget: %v", err)
			}
		})
		want := r
		want.Header = secrethdr.Withhold(r.Header)
		for _, tm := range []*time.Time{&want.Created, &want.Updated, &want.NextAttempt, &want.LeaseUntil} {
			if !tm.IsZero() {
				*tm = tm.UTC()
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("Begin returned %+v; want %+v", got, want)
		}
		read, err := j.Get(ctx, op)
		if err != nil || !reflect.DeepEqual(read, want) {
			t.Fatalf("Get = %+v, %v; want %+v", read, err, want)
		}
		byKey, err := j.ByKey(ctx, key)
		if err != nil || len(byKey) != 1 || !reflect.DeepEqual(byKey[0], want) {
			t.Fatalf("ByKey = %+v, %v; want [%+v]", byKey, err, want)
		}
		list, err := j.List(ctx, idem.Filter{})
		if err != nil || len(list) != 1 || !reflect.DeepEqual(list[0], want) {
			t.Fatalf("List = %+v, %v; want [%+v]", list, err, want)
		}
	})
}
