// Package payments is the reference server's application: a small payments
// API behind a testserver.Middleware, charging an in-process downstream
// processor, PayCo, that dedups on the server's own key charge:<order_id>.
// It is importable, so that a test or a lab can run the whole server in
// process; testserver/cmd/idemserver runs it as a program.
//
//	POST /v1/charges             amount, currency, order_id (or metadata[order_id]); JSON or form → 201 charge
//	GET  /v1/charges/{id}        → 200 charge, or 404
//	GET  /v1/orders/{order_id}   → 200 {"order_id": …, "charges": [...]}: reconcile an order
//	GET  /v1/stats               → 200 Stats, counted at PayCo
package payments

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/testserver"
)

// maxBody bounds the charge body this package reads itself, when no
// Middleware did.
const maxBody = 1 << 20

const problemBase = "https://github.com/idemkit/idem/blob/main/testserver/README.md#"

// Faults are switches for demos and tests. The zero value injects nothing.
type Faults struct {
	// FailAfterCharge, when it returns true for an order, makes the charge
	// answer 500 after PayCo charged: a failure between the downstream
	// call and the answer.
	FailAfterCharge func(orderID string) bool

	// Delay holds each charge's answer this long after PayCo charged (a
	// slow handler), or until the handler's context ends: with the
	// Middleware, when the claim's lease does.
	Delay time.Duration

	// Charged is called after each PayCo charge, before the answer is
	// written. A test can block in it, or kill a client or the process at
	// that moment.
	Charged func(Charge)
}

// App is the payments API. Set its fields, then call Handler.
type App struct {
	// PayCo is the downstream ledger. It must not be nil.
	PayCo *PayCo

	// Idempotency protects POST /v1/charges. Nil leaves it unprotected:
	// every request charges (the baseline the middleware is measured
	// against).
	Idempotency *testserver.Middleware

	// Faults are the failures the API injects, for tests and the lab.
	// The zero value injects none.
	Faults Faults

	// Logger receives the ledger's error behind each 502 payco-failed
	// (with the charge's order_id and, behind the Middleware, its key) and
	// 503 ledger-unavailable answer, at level ERROR, and the error of a
	// charge's body that could not be read (400 invalid-charge), at level
	// INFO: the client's fault, not the server's. The answer's detail does
	// not name it: a driver's error may name the
	// database's file, host, user or schema, and net/http's the server's
	// own address. Nil logs nothing.
	Logger *slog.Logger
}

// Handler returns the API's routes.
func (a *App) Handler() http.Handler {
	mux := http.NewServeMux()
	var charge http.Handler = http.HandlerFunc(a.charge)
	if a.Idempotency != nil {
		charge = a.Idempotency.Wrap(charge)
	}
	mux.Handle("POST /v1/charges", charge)
	mux.HandleFunc("GET /v1/charges/{id}", a.getCharge)
	mux.HandleFunc("GET /v1/orders/{order_id}", a.getOrder)
	mux.HandleFunc("GET /v1/stats", a.stats)
	return mux
}

// chargeRequest is the body of POST /v1/charges.
type chargeRequest struct {
	Amount   json.Number       `json:"amount"`
	Currency string            `json:"currency"`
	OrderID  string            `json:"order_id"`
	Metadata map[string]string `json:"metadata"`
}

func (a *App) charge(w http.ResponseWriter, r *http.Request) {
	req, p := a.parseCharge(w, r)
	if p != nil {
		testserver.WriteProblem(w, *p, 0)
		return
	}
	amount, currency, orderID, p := req.validate()
	if p != nil {
		testserver.WriteProblem(w, *p, 0)
		return
	}
	ctx := r.Context()
	c, err := a.PayCo.Charge(ctx, "charge:"+orderID, orderID, amount, currency)
	switch {
	case errors.Is(err, ErrKeyReused):
		testserver.WriteProblem(w, testserver.Problem{Type: problemBase + "order-charged", Title: "Order already charged", Status: http.StatusUnprocessableEntity,
			Detail: fmt.Sprintf("Order %q was already charged with another amount or currency; look it up at %s.", orderID, orderPath(orderID))}, 0)
		return
	case err != nil:
		a.log(r, slog.LevelError, "payments: charge failed", err, chargeAttrs(r, orderID)...)
		testserver.WriteProblem(w, testserver.Problem{Type: problemBase + "payco-failed", Title: "Payment processor failed", Status: http.StatusBadGateway,
			Detail: "The payment processor did not answer. " + a.nextStep(orderID)}, 0)
		return
	}
	if f := a.Faults.Charged; f != nil {
		f(c)
	}
	if f := a.Faults.FailAfterCharge; f != nil && f(orderID) {
		testserver.WriteProblem(w, testserver.Problem{Type: problemBase + "failed-after-charge", Title: "Failed after charging", Status: http.StatusInternalServerError,
			Detail: "The server failed after the processor charged the order (an injected fault). " + a.nextStep(orderID)}, 0)
		return
	}
	if d := a.Faults.Delay; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	w.Header().Set("Location", "/v1/charges/"+url.PathEscape(c.ID))
	writeJSON(w, http.StatusCreated, c)
}

// parseCharge decodes a JSON or form body.
func (a *App) parseCharge(w http.ResponseWriter, r *http.Request) (chargeRequest, *testserver.Problem) {
	var req chargeRequest
	invalid := func(detail string) (chargeRequest, *testserver.Problem) {
		return req, &testserver.Problem{Type: problemBase + "invalid-charge", Title: "Invalid charge request", Status: http.StatusBadRequest, Detail: detail}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return invalid(fmt.Sprintf("The body is larger than %d bytes.", mbe.Limit))
	case err != nil:
		// Not named in the answer: net/http's error names the server's
		// own address.
		a.log(r, slog.LevelInfo, "payments: reading the body failed", err)
		return invalid("The body could not be read; send it again.")
	}
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch {
	case mt == "application/json" || strings.HasSuffix(mt, "+json"):
		dec := json.NewDecoder(strings.NewReader(string(body)))
		dec.UseNumber()
		if err := dec.Decode(&req); err != nil {
			return invalid("The body is not a valid JSON charge: " + err.Error() + ".")
		}
		// One object, and nothing after it but white space: what follows
		// would otherwise be ignored, a second charge among it.
		if _, err := dec.Token(); err != io.EOF {
			return invalid("The body is not a valid JSON charge: data follows its JSON object.")
		}
	case mt == "application/x-www-form-urlencoded":
		form, err := url.ParseQuery(string(body))
		if err != nil {
			return invalid("The form body is malformed: " + err.Error() + ".")
		}
		req.Amount = json.Number(form.Get("amount"))
		req.Currency = form.Get("currency")
		req.OrderID = form.Get("order_id")
		if v := form.Get("metadata[order_id]"); v != "" {
			req.Metadata = map[string]string{"order_id": v}
		}
	default:
		return req, &testserver.Problem{Type: problemBase + "unsupported-media-type", Title: "Unsupported media type", Status: http.StatusUnsupportedMediaType,
			Detail: "Send the charge as application/json or application/x-www-form-urlencoded."}
	}
	return req, nil
}

// validate returns the charge's fields, or the problem with them.
func (req chargeRequest) validate() (amount int64, currency, orderID string, p *testserver.Problem) {
	var bad []string
	amount, err := strconv.ParseInt(string(req.Amount), 10, 64)
	if err != nil || amount <= 0 {
		bad = append(bad, "amount must be a positive whole number of the currency's minor unit (1000 is 10.00)")
	}
	currency = strings.ToLower(req.Currency)
	if len(currency) != 3 || strings.Trim(currency, "abcdefghijklmnopqrstuvwxyz") != "" {
		bad = append(bad, "currency must be a three-letter ISO 4217 code such as usd")
	}
	orderID = req.OrderID
	if orderID == "" {
		orderID = req.Metadata["order_id"]
	}
	if !validOrderID(orderID) {
		bad = append(bad, "order_id (or metadata[order_id]) must be 1 to 255 visible ASCII characters, no spaces")
	}
	if len(bad) > 0 {
		return 0, "", "", &testserver.Problem{Type: problemBase + "invalid-charge", Title: "Invalid charge request", Status: http.StatusBadRequest,
			Detail: strings.Join(bad, "; ") + "."}
	}
	return amount, currency, orderID, nil
}

func validOrderID(id string) bool {
	if id == "" || len(id) > 255 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= ' ' || id[i] > '~' {
			return false
		}
	}
	return true
}

// nextStep ends the detail of a failed charge's answer: what its caller
// does next. Under the Middleware's SaveError the answer is saved and every
// retry of its key gets it replayed, so the caller is sent to the order
// instead of to a retry.
func (a *App) nextStep(orderID string) string {
	if a.Idempotency != nil && a.Idempotency.OnError == testserver.SaveError {
		return fmt.Sprintf("This answer is saved for the Idempotency-Key, and a retry gets it again: look the order up at %s before charging it again with a new key.", orderPath(orderID))
	}
	return "Retry the request with the same Idempotency-Key."
}

// orderPath returns the path of GET /v1/orders/{order_id} for id. An id of
// "." or ".." is escaped whole: as it is, it would be a dot segment, which
// the router cleans away (and a client's URL parser with it).
func orderPath(id string) string {
	if id == "." || id == ".." {
		return "/v1/orders/" + strings.ReplaceAll(id, ".", "%2E")
	}
	return "/v1/orders/" + url.PathEscape(id)
}

func (a *App) getCharge(w http.ResponseWriter, r *http.Request) {
	c, err := a.PayCo.Get(r.Context(), r.PathValue("id"))
	switch {
	case errors.Is(err, ErrNoCharge):
		testserver.WriteProblem(w, testserver.Problem{Type: problemBase + "no-charge", Title: "No such charge", Status: http.StatusNotFound,
			Detail: fmt.Sprintf("There is no charge %q. To find an order's charges, GET /v1/orders/{order_id}.", r.PathValue("id"))}, 0)
	case err != nil:
		a.ledgerFailed(w, r, err)
	default:
		writeJSON(w, http.StatusOK, c)
	}
}

func (a *App) getOrder(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("order_id")
	cs, err := a.PayCo.Order(r.Context(), id)
	if err != nil {
		a.ledgerFailed(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		OrderID string   `json:"order_id"`
		Charges []Charge `json:"charges"`
	}{id, cs})
}

func (a *App) stats(w http.ResponseWriter, r *http.Request) {
	s, err := a.PayCo.Stats(r.Context())
	if err != nil {
		a.ledgerFailed(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s)
}

func (a *App) ledgerFailed(w http.ResponseWriter, r *http.Request, err error) {
	a.log(r, slog.LevelError, "payments: ledger read failed", err)
	testserver.WriteProblem(w, testserver.Problem{Type: problemBase + "ledger-unavailable", Title: "Ledger unavailable", Status: http.StatusServiceUnavailable,
		Detail: "The ledger could not be read; retry later."}, 1)
}

func (a *App) log(r *http.Request, level slog.Level, msg string, err error, attrs ...any) {
	if a.Logger != nil {
		a.Logger.Log(r.Context(), level, msg, append([]any{"method", r.Method, "path", r.URL.Path}, append(attrs, "err", err)...)...)
	}
}

// chargeAttrs are the attributes that tell a charge's record from the
// others: its order and, behind the Middleware, its Idempotency-Key, one of
// which the client that reports the failure names.
func chargeAttrs(r *http.Request, orderID string) []any {
	attrs := []any{"order_id", orderID}
	if c, ok := testserver.ClaimFrom(r.Context()); ok {
		attrs = append(attrs, "key", c.Key)
	}
	return attrs
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil { // cannot happen: plain structs
		panic(err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}
