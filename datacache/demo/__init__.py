"""Demo and test data: a local moto S3 server and a deterministic, realistic training set."""
