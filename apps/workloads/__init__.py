"""What every kind of workload (job, instance, notebook) shares on its way to a backend."""
