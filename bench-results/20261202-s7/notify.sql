NOTIFY tally_due, '0';
NOTIFY tally_lease, '1';
