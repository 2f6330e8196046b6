package canon

import "testing"

// smallBody is a typical payment request body.
const smallBody = `{"amount":1000,"currency":"eur","order":"order-42","customer":"cus_8f2a"}`

// nestedBody is a larger, indented order with nested objects and arrays.
const nestedBody = `{
  "order": "order-42",
  "customer": {
    "id": "cus_8f2a",
    "name": "Ada Lovelace",
    "email": "ada@example.com",
    "address": {"line1": "12 Analytical Way", "city": "London", "postcode": "N1 9GU", "country": "GB"},
    "tags": ["vip", "newsletter", "b2b"]
  },
  "currency": "eur",
  "amount": 15497,
  "items": [
    {"sku": "SKU-0001", "name": "Brass gear, small", "quantity": 12, "unit_price": 199, "tax_rate": 0.2, "attributes": {"finish": "polished", "teeth": 24}},
    {"sku": "SKU-0002", "name": "Brass gear, large", "quantity": 4, "unit_price": 899, "tax_rate": 0.2, "attributes": {"finish": "matte", "teeth": 96}},
    {"sku": "SKU-0107", "name": "Punched card pack", "quantity": 30, "unit_price": 149, "tax_rate": 0.05, "attributes": {"count": 500, "colour": "manila"}},
    {"sku": "SKU-0233", "name": "Crank handle", "quantity": 1, "unit_price": 2450, "tax_rate": 0.2, "attributes": {"material": "oak", "length_mm": 320}},
    {"sku": "SKU-0990", "name": "Maintenance kit", "quantity": 2, "unit_price": 1299, "tax_rate": 0.2, "attributes": {"oil": true, "brushes": 3}}
  ],
  "shipping": {"method": "express", "amount": 995, "carrier": null, "eta_days": [1, 2], "insured": true},
  "discounts": [{"code": "SPRING10", "percent": 10}, {"code": "LOYAL", "amount": 500}],
  "payment": {
    "method": "card",
    "card": {"brand": "visa", "last4": "4242", "exp_month": 12, "exp_year": 2031},
    "capture": false,
    "three_d_secure": {"required": true, "version": "2.2.0"}
  },
  "metadata": {
    "channel": "web",
    "campaign": "spring-sale",
    "session": "sess_1b7c9d2e4f",
    "ab_test": {"bucket": "B", "weight": 0.5},
    "referrer": "https://example.com/catalogue?page=3&sort=price",
    "notes": "Leave at the reception desk; ring twice.",
    "ratings": [4.5, 3.75, 5, -1e-3, 2.5E+2]
  },
  "created_at": "2025-03-14T09:26:53Z",
  "idempotent": true,
  "version": 3
}`

// BenchmarkJSON compares JSON, which takes the fast path for these bodies,
// with jsonSlow, the encoding/json definition.
func BenchmarkJSON(b *testing.B) {
	for _, body := range []struct {
		name string
		in   string
	}{{"small", smallBody}, {"nested", nestedBody}} {
		for _, impl := range []struct {
			name string
			f    func([]byte) ([]byte, error)
		}{{"fast", JSON}, {"slow", jsonSlow}} {
			in := []byte(body.in)
			b.Run("body="+body.name+"/impl="+impl.name, func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(in)))
				for b.Loop() {
					if _, err := impl.f(in); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
