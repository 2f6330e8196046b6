package pgstore

// MigrateLock is the advisory lock that serialises migrations.
const MigrateLock = migrateLock
