"""What the gateway keeps in its database: keys, the server secret, the ledger and its spool, migrations."""
