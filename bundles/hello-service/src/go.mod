module mesh.example/hello-service

go 1.22
