package pgstore

// MigrateLock is the advisory lock that serialises migrations.
var MigrateLock = schema.Lock
