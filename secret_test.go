package idem_test

import (
	"testing"

	"github.com/idemkit/idem"
)

func TestSecretHeader(t *testing.T) {
	for name, want := range map[string]bool{
		"Authorization": true, "authorization": true, "Proxy-Authorization": true, "Cookie": true, "Set-Cookie": true,
		"X-Auth-Token": true, "X-TOKEN": true, "x-api-key": true, "X-Apikey": true, "Client-Secret": true,
		"X-Password-Hash": true, "Tok": false, "X-Api-Version": false, "Content-Type": false,
		"Idempotency-Key": false, "": false, "X-Tokens-Left": true,
		// Credentials under other names than the standard ones.
		"X-Authorization": true, "X-Auth-Key": true, "Proxy_Authorization": true, "Authorization ": true,
		"X-Api_Key": true, "api_key": true,
		// Names that contain an API key's name without ending in "key".
		"X-Api-Key-Id": true, "X-Apikey-Id": true, "X-Api_Key_Id": true,
		// API keys and sessions named otherwise: Azure API Management,
		// Azure Functions, Datadog.
		"Ocp-Apim-Subscription-Key": true, "X-Functions-Key": true, "DD-APPLICATION-KEY": true,
		"X-Masterkey": true, "X-Session-Id": true, "X-Client-Credential": true,
		"X-Key-Id": false, "Keyword": false,
		// Bearer assertions and RFC 9421 message signatures, credentials
		// while they are valid: Google IAP's signed header, a JWT or
		// assertion by any name, and Signature, but not Signature-Input,
		// which lists the fields it covers. AWS's security token is one;
		// its content hash is not.
		"X-Goog-Iap-Jwt-Assertion": true, "X-Jwt": true, "X-Client-Assertion": true,
		"Signature": true, "signature": true, "Signature-Input": false,
		"X-Amz-Security-Token": true, "X-Amz-Content-Sha256": false, "X-Amz-Date": false,
		// Webhook signatures, an HMAC of the body that the receiver
		// accepts with that body, which the jar keeps: GitHub's, Stripe's,
		// Slack's, Twilio's, Shopify's.
		"X-Hub-Signature": true, "X-Hub-Signature-256": true, "Stripe-Signature": true,
		"X-Slack-Signature": true, "X-Twilio-Signature": true, "X-Shopify-Hmac-Sha256": true,
		// Exchange APIs that place orders, a POST that must not run
		// twice: the API key's passphrase, a credential that stays valid,
		// and the request's HMAC signature under a name that ends in
		// "sign" (Coinbase's, KuCoin's, OKX's, Bybit's, Kraken's).
		"CB-ACCESS-PASSPHRASE": true, "KC-API-PASSPHRASE": true, "OK-ACCESS-PASSPHRASE": true, "X-Passwd": true,
		"CB-ACCESS-SIGN": true, "KC-API-SIGN": true, "OK-ACCESS-SIGN": true, "X-BAPI-SIGN": true, "API-Sign": true,
		"Sign": true, "X_Sign": true, "X-Design": false, "X-Assign-To": false, "CB-ACCESS-TIMESTAMP": false,
	} {
		if got := idem.SecretHeader(name); got != want {
			t.Errorf("SecretHeader(%q) = %v; want %v", name, got, want)
		}
	}
}
