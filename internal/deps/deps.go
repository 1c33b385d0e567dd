//go:build tools

// Package deps pins the modules the project's packages and tests use, so parallel work
// never races on go.mod. It is never built.
package deps

import (
	_ "github.com/anishathalye/porcupine"
	_ "github.com/aws/aws-lambda-go/events"
	_ "github.com/aws/aws-lambda-go/lambda"
	_ "github.com/aws/aws-sdk-go-v2/aws"
	_ "github.com/aws/aws-sdk-go-v2/config"
	_ "github.com/aws/aws-sdk-go-v2/credentials"
	_ "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	_ "github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	_ "github.com/aws/aws-sdk-go-v2/service/ssm"
	_ "github.com/aws/smithy-go/middleware"
	_ "github.com/awslabs/goformation/v7/cloudformation"
	_ "github.com/chromedp/chromedp"
	_ "github.com/getkin/kin-openapi/openapi3filter"
	_ "github.com/santhosh-tekuri/jsonschema/v6"
	_ "go.yaml.in/yaml/v3"
	_ "golang.org/x/sync/errgroup"
)
